#!/usr/bin/env bash
# Session 23, call 2: rope_append one warp per head in blocks of 8 warps (the table's loads
# before the programmatic wait): the bit tests, then HEAD (8b06d38) against the new source
# alternating twice, then ncu of the new rope_append at the card's clocks.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 200 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
dec() { # name binary
  local t1=$(date +%s)
  timeout 150 .gpu/$2 --model $M/qwen3-8b --batch 1,64 --prompt 512 --tokens 64 \
    --prefill 512,2048 --mixed 64:960 --max-step-tokens 1024 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec base_a gpu_decode_base
dec new_a gpu_decode
dec base_b gpu_decode_base
dec new_b gpu_decode
if [ $(( $(date +%s) - T0 )) -lt 480 ]; then
  t1=$(date +%s)
  timeout 90 ncu --graph-profiling node --clock-control none -k "regex:rope_append" --launch-skip 37 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 1024 > $O/ncu_rope.log 2>&1
  echo "ncu rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
fi
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick" $O/bits.log
for f in base_a new_a base_b new_b; do echo "-- $f"; grep -E "^\| |panick|rror" $O/dec_$f.log | grep -v "^| batch\|^| prompt\|^|---" | head -12; done
grep -E "rope_append|duration|dram__|warps_active" $O/ncu_rope.log | head -12
