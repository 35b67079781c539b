#!/usr/bin/env bash
# Session 19, call 7: the decode kernels' padding rows (8-15) skipped in the softmax (same bits):
# the bit tests first (they compile and cache the new kernels), then gpu_decode (new) and
# gpu_decode_base (dcdfd14) at batch 1/32/64 over 512-token prompts.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; M=/tmp/nerva-models; mkdir -p $M
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/r7_gpu.txt
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 170 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/r7_bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/r7_times.txt
t1=$(date +%s)
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t1 )) s" >> $O/r7_times.txt
dec() { # name binary
  local t1=$(date +%s)
  timeout 150 .gpu/$2 --model $M/qwen3-8b --batch 1,32,64 --prompt 512 --tokens 48 --prefill 2048 \
    --max-step-tokens 2048 > $O/r7_dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/r7_times.txt
}
dec new gpu_decode
dec base gpu_decode_base
echo "===== summary"
cat $O/r7_times.txt
grep -E "^test |test result" $O/r7_bits.log
for f in new base; do echo "-- $f"; grep -E "^\| [0-9]|panick|rror" $O/r7_dec_$f.log | head -6; done
