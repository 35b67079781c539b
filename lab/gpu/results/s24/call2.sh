#!/usr/bin/env bash
# Session 24, call 2: rope_append two tokens per warp and the attention's merges writing only
# the o projection's 16-bit input where it reads that (same bits): the bit tests, then c72bf78
# against the new source alternating twice (2,048-token budget), then ncu of both kernels.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
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
  timeout 130 .gpu/$2 --model $M/qwen3-8b --batch 1,64 --prompt 512 --tokens 64 \
    --prefill 2048 --mixed 64:960 --max-step-tokens 2048 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec base_a gpu_decode_base
dec new_a gpu_decode
dec base_b gpu_decode_base
dec new_b gpu_decode
for b in base new; do
  [ $(( $(date +%s) - T0 )) -lt 500 ] || break
  bin=gpu_decode; [ $b = base ] && bin=gpu_decode_base
  t1=$(date +%s)
  timeout 60 ncu --graph-profiling node --clock-control none -k "regex:rope_append|attn_prefill_fold" \
    --launch-skip 20 --launch-count 4 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    .gpu/$bin --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 2048 > $O/ncu_$b.log 2>&1
  echo "ncu_$b rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick" $O/bits.log
for f in base_a new_a base_b new_b; do echo "-- $f"; grep -E "^\| [0-9]|mixed steps|panick|rror" $O/dec_$f.log | head -6; done
for b in base new; do echo "-- ncu $b"; grep -E "rope_append|attn_prefill_fold|duration|dram__|warps_active" $O/ncu_$b.log | head -16; done
