#!/usr/bin/env bash
# Session 24, call 4: to_half_rms holds its row in registers for every slice count (decode steps
# of 4+ tokens cut a row over several blocks): the bit tests, then 978461b against the new source
# alternating twice, then ncu of to_half_rms in batch-64 decode steps.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 250 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
dec() { # name binary
  local t1=$(date +%s)
  timeout 150 .gpu/$2 --model $M/qwen3-8b --batch 1,16,32,64 --prompt 512 --tokens 64 \
    --prefill 2048 --mixed 64:448 --max-step-tokens 2048 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec base_a gpu_decode_base
dec new_a gpu_decode
dec base_b gpu_decode_base
dec new_b gpu_decode
for b in base new; do
  [ $(( $(date +%s) - T0 )) -lt 520 ] || break
  bin=gpu_decode; [ $b = base ] && bin=gpu_decode_base
  t1=$(date +%s)
  timeout 50 ncu --graph-profiling node --clock-control none -k "regex:to_half_rms" \
    --launch-skip 200 --launch-count 4 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    .gpu/$bin --model $M/qwen3-8b --batch 64 --tokens 8 --prefill "" > $O/ncu_$b.log 2>&1
  echo "ncu_$b rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick" $O/bits.log
for f in base_a new_a base_b new_b; do echo "-- $f"; grep -E "^\| [0-9]|mixed steps|panick|rror" $O/dec_$f.log | head -7; done
for b in base new; do echo "-- ncu $b"; grep -E "^\s+to_half|duration|dram__" $O/ncu_$b.log | head -12; done
