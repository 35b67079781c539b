#!/usr/bin/env bash
# Session 25, call 2: attn_prefill_fold in 12 warps with its sums in shared memory (same bits):
# the bit tests, then HEAD (58916ed, 8 warps) against the new source alternating twice, then
# ncu of the fold kernel in a 2,048-token prompt at the card's clocks, both binaries.
# (The kernel change is fold12.patch; measured and not kept.)
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
  timeout 100 .gpu/$2 --model $M/qwen3-8b --batch 1,64 --prompt 512 --tokens 64 \
    --prefill 512,2048 --mixed 64:960 --max-step-tokens 2048 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 430 ] || break
  dec base_$r gpu_decode_base
  dec new_$r gpu_decode
done
for b in gpu_decode_base gpu_decode; do
  [ $(( $(date +%s) - T0 )) -lt 500 ] || break
  t1=$(date +%s)
  timeout 60 ncu --clock-control none -k regex:attn_prefill_fold --launch-skip 40 --launch-count 3 \
    --metrics gpu__time_duration.sum,sm__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
    .gpu/$b --model $M/qwen3-8b --batch 1 --prompt 128 --tokens 8 --prefill 2048 --max-step-tokens 2048 > $O/ncu_$b.log 2>&1
  echo "ncu_$b rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick|differ" $O/bits.log | head -20
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| |panick|rror|mixed step" $O/dec_$f.log | grep -v "^| batch\|^| prompt\|^|---" | head -8; done
for b in gpu_decode_base gpu_decode; do echo "-- ncu $b"; grep -E "attn_prefill_fold|duration|inst_executed|warps_active|issue_active" $O/ncu_$b.log | head -16; done
