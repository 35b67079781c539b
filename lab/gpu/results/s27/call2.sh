#!/usr/bin/env bash
# Session 27, call 2: where the prompt attention's time goes, mma.sync fold vs wgmma fold (same
# binary, NERVA_ATTN_WGMMA=0/1): ncu durations of the 2,048-token prompt's attention launches at
# the card's clocks, and one launch of each with the full set; then the bit tests (the 0.6B part
# that call 1's limit cut).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
t1=$(date +%s)
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t1 )) s" >> $O/times.txt
for w in 1 0; do
  t1=$(date +%s)
  # The decode table's 128-token prompt takes the first 36 attention launches.
  NERVA_ATTN_WGMMA=$w timeout 150 ncu --graph-profiling node --clock-control none -k "regex:attn_prefill" \
    --launch-skip 36 --launch-count 6 --metrics gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 2048 > $O/ncu_w$w.txt 2>&1
  echo "ncu_w$w rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  t1=$(date +%s)
  NERVA_ATTN_WGMMA=$w timeout 150 ncu --graph-profiling node --clock-control none -k "regex:attn_prefill" \
    --launch-skip 40 --launch-count 1 --set full --import-source no -o $O/full_w$w \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 2048 > $O/ncu_full_w$w.log 2>&1
  ncu -i $O/full_w$w.ncu-rep --print-details all > $O/full_w$w.txt 2>&1
  rm -f $O/full_w$w.ncu-rep
  echo "full_w$w rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout $(( 560 - ($(date +%s) - T0) )) .gpu/cuda_backend --nocapture --test-threads 1 prefill_and_fused > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick|differ|Qwen3_0_6b" $O/bits.log | cut -c1-150 | head -30
for w in 1 0; do echo "-- w$w"; grep -E "attn_prefill|gpu__time|inst_executed|issue_active|warps_active" $O/ncu_w$w.txt | head -30; done
for w in 1 0; do echo "-- full w$w"; grep -E "Duration|Registers Per|Achieved Occ|Issued Warp|Eligible Warps|No Eligible|Stall|Warp Cycles Per Issued|Executed Ipc" $O/full_w$w.txt | head -20; done
