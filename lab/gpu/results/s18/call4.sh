#!/usr/bin/env bash
# Session 16, call 4: down_proj's prepared inputs from gate|up's GLU epilogue (no to_half launch
# for down) — the GPU tests, then old (gpu_decode_base = 330f13d) against new, alternating.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r4_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
( for p in qwen3-8b; do [ -f $M/$p/config.json ] || .gpu/nervad make-model --preset $p --out $M/$p --seed 1234 >/dev/null; done; touch $M/ready ) &
( time NERVA_GPU_BIG=1 timeout 330 .gpu/cuda_backend --nocapture --test-threads 1 ) > $O/r4_tests.log 2>&1
while [ ! -f $M/ready ]; do sleep 2; done
for b in base new base new; do
  bin=.gpu/gpu_decode; [ $b = base ] && bin=.gpu/gpu_decode_base
  echo "== $b" >> $O/r4_decode.log
  timeout 150 $bin --model $M/qwen3-8b --batch 1,8,32,64 --prompt 512 --tokens 64 --max-step-tokens 1024 --prefill 512,2048 --mixed 64:960 2>&1 | grep -E "bandwidth|^\| [0-9]|mixed|rror|panic" >> $O/r4_decode.log
done
echo "===== summary"
grep -E '^test |test result|real|differs|panicked' $O/r4_tests.log | cut -c1-200
cat $O/r4_decode.log
