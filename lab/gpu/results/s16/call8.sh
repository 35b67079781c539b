#!/usr/bin/env bash
# Session 14, call 8: the final source (acc5726): GPU tests, A/B against 1489310 (before this session).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r8_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
( time NERVA_GPU_BIG=1 .gpu/cuda_backend --nocapture --test-threads 1 ) > $O/r8_tests.log 2>&1
grep -E '^test |test result|real' $O/r8_tests.log
AB_BATCH=1,8,32,64 AB_PROMPT=512 AB_PREFILL=512,2048 lab/gpu/ab_decode.sh .gpu $O/ab gpu_decode_base gpu_decode qwen3-8b > /dev/null 2>&1
cp $O/ab/ab.log $O/r8_ab.log
echo "===== summary"; grep -E '^== |^\| [0-9]|bandwidth' $O/r8_ab.log | cut -c1-110
