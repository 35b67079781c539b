#!/usr/bin/env bash
# Session 15, call 6 (main cebe4c8): where qwen3-0.6b's batch-1 step goes (ncu per kernel, card's
# clocks) against its wall-clock step; the 512-token prompt's kernels (ncu, base clocks).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r6_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
for p in qwen3-0.6b qwen3-8b; do [ -f $M/$p/config.json ] || .gpu/nervad make-model --preset $p --out $M/$p --seed 1234 >/dev/null; done
timeout 120 .gpu/gpu_decode --model $M/qwen3-0.6b --batch 1,8 --prompt 128 --tokens 256 --prefill "" 2>&1 | grep -E "bandwidth|weights read|^\| [0-9]" | tee $O/r6_small_decode.log
timeout 200 ncu --clock-control none --graph-profiling node --launch-skip 3000 --launch-count 288 \
  --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum \
  .gpu/gpu_decode --model $M/qwen3-0.6b --batch 1 --prompt 128 --tokens 48 --prefill "" > /tmp/r6_ncu_small.txt 2>&1
python3 .gpu/ncu_sum.py /tmp/r6_ncu_small.txt > $O/r6_ncu_small_summary.log 2>&1
NCU_PREFILL=512 bash lab/gpu/run_cuda.sh .gpu $O/pf ncu-prefill > /dev/null 2>&1
cp $O/pf/ncu_prefill_summary.log $O/r6_ncu_prefill512_summary.log; rm -rf $O/pf
echo "===== summary"
cat $O/r6_small_decode.log
cat $O/r6_ncu_small_summary.log
cat $O/r6_ncu_prefill512_summary.log
