#!/usr/bin/env bash
# Session 24, call 1: the GLU epilogue writes only the 16-bit copy where the next launch reads
# it, and to_half_rms holds its row in registers (same bits): the bit tests, the GEMM peak, then
# HEAD (ca846db) against the new source alternating twice at 1,024- and 2,048-token budgets.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 230 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
t1=$(date +%s)
timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak.log 2>&1
echo "peak rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
dec() { # name binary budget
  local t1=$(date +%s)
  timeout 130 .gpu/$2 --model $M/qwen3-8b --batch 1,64 --prompt 512 --tokens 64 \
    --prefill 2048 --mixed 64:960 --max-step-tokens $3 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for b in 1024 2048; do
  for r in a b; do
    [ $(( $(date +%s) - T0 )) -lt 520 ] || break
    dec base_${b}_$r gpu_decode_base $b
    dec new_${b}_$r gpu_decode $b
  done
done
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick" $O/bits.log
grep -iE "peak|TFLOP" $O/peak.log | head -3
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| |panick|rror" $O/dec_$f.log | grep -v "^| batch\|^| prompt\|^|---" | head -8; done
