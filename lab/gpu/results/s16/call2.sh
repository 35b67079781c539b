#!/usr/bin/env bash
# Session 14, call 2: the persistent 64-token wgmma GEMM (wg64s): bits, per projection, whole steps.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/r2_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
for f in kernel_variants_give_identical_bits tensor_projections_are_batch_invariant; do
  NERVA_GPU_BIG=1 timeout 300 .gpu/cuda_backend --nocapture --test-threads 1 $f > $O/r2_bits_$f.log 2>&1
  grep -E '^test |test result|panicked|differ' $O/r2_bits_$f.log | head -8
done
for s in 0 1; do
  echo "== gpu_kernels NERVA_WG_STREAM=$s"
  NERVA_WG_STREAM=$s timeout 200 .gpu/gpu_kernels --tokens 1 --mma-tokens 64 --gemm-tokens 32,64 --only qwen3-8b > $O/r2_kernels_$s.log 2>&1
  grep -E 'qwen3-8b' $O/r2_kernels_$s.log | head -30
done
for i in 1 2; do for s in 0 1; do
  echo "== gpu_decode NERVA_WG_STREAM=$s run $i"
  NERVA_WG_STREAM=$s timeout 300 .gpu/gpu_decode --model $M/qwen3-8b --batch 32,48,64 --prompt 512 --prefill "" --max-step-tokens 2048 --json 2>&1 | grep -E "^\| [0-9]|bandwidth|panick" | tee -a $O/r2_ab_$s.log
done; done
echo "===== summary"; for s in 0 1; do echo "-- stream=$s"; grep -E '^\| [0-9]' $O/r2_ab_$s.log | cut -c1-80; done
