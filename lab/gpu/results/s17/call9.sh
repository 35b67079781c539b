#!/usr/bin/env bash
# Session 15, call 9 (main at the session's end): the GPU tests, and batch 1/64 plus a mixed step
# as a check that the last host refactors changed no speed.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r9_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
( time NERVA_GPU_BIG=1 timeout 400 .gpu/cuda_backend --nocapture --test-threads 1 ) > $O/r9_tests.log 2>&1
timeout 150 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,64 --prompt 512 --tokens 64 --max-step-tokens 1024 --prefill 512 --mixed 64:960 2>&1 | grep -E "bandwidth|^\| [0-9]|mixed steps" > $O/r9_decode.log
echo "===== summary"
grep -E '^test |test result|real' $O/r9_tests.log | cut -c1-160
cat $O/r9_decode.log
