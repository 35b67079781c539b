#!/usr/bin/env bash
# Session 23, call 1 (diagnostic): the 2,048-token prompt's kernels at the card's own clocks in
# the timed runs' 1,024-token chunks (both chunks), and rope_append / to_half_rms under ncu --set full.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - T0 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 240 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,64 --prompt 512 --tokens 64 --prefill 512,2048 --max-step-tokens 1024 > $O/dec.log 2>&1
echo "decode $(( $(date +%s) - t1 )) s" >> $O/times.txt
for c in 1 2; do
  t1=$(date +%s)
  NCU_CLOCKS=none NCU_PREFILL_STEP=1024 NCU_PREFILL_SKIP=$(( 360 * c )) NCU_PREFILL_LAUNCHES=30 timeout 150 bash lab/gpu/run_cuda.sh .gpu $O/p ncu-prefill > $O/ncu_prefill_console_$c.log 2>&1
  cp $O/p/ncu_prefill_summary.log $O/ncu_prefill_chunk$c.log; cp $O/p/ncu_prefill.txt $O/ncu_prefill_chunk$c.txt
  rm -rf $O/p
  echo "ncu-prefill chunk $c $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
t1=$(date +%s)
timeout 150 ncu --graph-profiling node --clock-control none -k "regex:rope_append|to_half_rms" --launch-skip 111 --launch-count 3 --set full --import-source no -o $O/small \
  .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 1024 > $O/ncu_small.log 2>&1
ncu -i $O/small.ncu-rep --page details > $O/small_details.txt 2>&1
ncu -i $O/small.ncu-rep --page source --print-source sass --csv > /tmp/small_sass.csv 2>/dev/null
python3 lab/gpu/ncu_sass_summary.py --top 25 /tmp/small_sass.csv > $O/small_stalls.txt 2>&1
rm -f $O/small.ncu-rep
echo "ncu-small $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -A12 "prefill (" $O/dec.log; grep -E "^\| (1|64) \|" $O/dec.log
cat $O/ncu_prefill_chunk1.log $O/ncu_prefill_chunk2.log
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occ|Registers Per|Issued Ipc" $O/small_details.txt | head -40
