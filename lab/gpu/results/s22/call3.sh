#!/usr/bin/env bash
# Session 20, call 3: the final source (the folded prompt attention two tiles per barrier, its
# page lookups by shift): the GEMM peak, gpu_decode_base (4de47be) against gpu_decode
# alternating twice, then every GPU test on the new kernels.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
t1=$(date +%s)
timeout 150 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak.log 2>&1
echo "peak rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
dec() { # name binary
  local t1=$(date +%s)
  timeout 150 .gpu/$2 --model $M/qwen3-8b --batch 1,32,64 --prompt 512 --tokens 64 \
    --prefill 512,2048 --mixed 64:448,64:960 --max-step-tokens 1024 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec base_a gpu_decode_base
dec new_a gpu_decode
dec base_b gpu_decode_base
dec new_b gpu_decode
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 200 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "peak|rror" $O/peak.log
for f in base_a new_a base_b new_b; do echo "-- $f"; grep -E "^\| |mixed steps|panick|rror" $O/dec_$f.log | grep -v "^| batch\|^| prompt" | head -12; done
grep -E "^test |test result" $O/tests.log
