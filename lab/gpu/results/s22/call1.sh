#!/usr/bin/env bash
# Session 20, call 1: the prompt attention software-pipelined (tile k+1's scores during tile k's
# softmax, three stages), the softmax's two rows side by side, o's rescale skipped while it is 0,
# o reset only at split ends: gpu_decode_base (4de47be) against gpu_decode, alternating twice;
# then the bit tests on the new kernels.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
dec() { # name binary
  local t1=$(date +%s)
  timeout 200 .gpu/$2 --model $M/qwen3-8b --batch 1,32,64 --prompt 512 --tokens 64 \
    --prefill 512,2048 --mixed 64:448,64:960 --max-step-tokens 1024 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec base_a gpu_decode_base
dec new_a gpu_decode
dec base_b gpu_decode_base
dec new_b gpu_decode
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 220 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/times.txt
for f in base_a new_a base_b new_b; do echo "-- $f"; grep -E "^\| |mixed steps|panick|rror" $O/dec_$f.log | grep -v "^| batch\|^| prompt" | head -12; done
grep -E "^test |test result" $O/bits.log
