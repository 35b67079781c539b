#!/usr/bin/env bash
# Session 14, call 5: ncu at the card's own clocks (--clock-control none): per-kernel time of a batch-64 step, wg64 vs wg64s.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv | tee $O/r5_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
for s in 0 1; do
  NERVA_WG_STREAM=$s timeout 280 ncu --clock-control none --graph-profiling node --launch-skip 11000 --launch-count 420 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 64 --prefill "" --max-step-tokens 2048 > $O/r5_ncu_step_$s.txt 2>&1
  echo "== stream=$s"; python3 .gpu/ncu_sum.py $O/r5_ncu_step_$s.txt | tee $O/r5_ncu_step_${s}_summary.log
done
