#!/usr/bin/env bash
# Session 16, calls 1 and 2: the decode layer kernel — bits against the five kernels, then batch 1-8
# speed with it off and on (same binary, NERVA_LAYER_KERNEL).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r2_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
( for p in qwen3-0.6b qwen3-8b; do [ -f $M/$p/config.json ] || .gpu/nervad make-model --preset $p --out $M/$p --seed 1234 >/dev/null; done; touch $M/ready ) &
( time NERVA_GPU_BIG=1 timeout 240 .gpu/cuda_backend kernel_variants_give_identical_bits --nocapture --test-threads 1 ) > $O/r2_bits.log 2>&1
while [ ! -f $M/ready ]; do sleep 2; done
for m in qwen3-0.6b qwen3-8b; do
  for L in 0 8 0 8; do
    echo "== $m NERVA_LAYER_KERNEL=$L" >> $O/r2_decode.log
    NERVA_LAYER_KERNEL=$L timeout 120 .gpu/gpu_decode --model $M/$m --batch 1,2,4,8 --prompt 128 --tokens 256 --prefill "" 2>&1 | grep -E "bandwidth|graph nodes|^\| [0-9]|rror|panic" >> $O/r2_decode.log
    [ $m = qwen3-8b ] && [ $L = 8 ] && break
  done
done
echo "===== summary"
grep -E '^test |test result|real|bit-identical|differs|panicked' $O/r2_bits.log | cut -c1-200
cat $O/r2_decode.log
