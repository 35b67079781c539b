#!/usr/bin/env bash
# Session 19, call 5: the softmax in base 2 (ex2.approx) against e^x: gpu_decode_base (the fast
# paths, HEAD) against gpu_decode (+ base 2), alternating twice; then every GPU test (0.6B
# included) and the tiny presets' parity against transformers on the new kernels.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r5; mkdir -p $O
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
NERVA_GPU_BIG=1 timeout 260 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r5.tgz -C $OUT r5
echo "===== summary"
cat $O/times.txt
for f in base_a new_a base_b new_b; do echo "-- $f"; grep -E "^\| |mixed steps|panick|rror" $O/dec_$f.log | grep -v "^| batch\|^| prompt" | head -12; done
grep -E "^test |test result" $O/tests.log
