#!/usr/bin/env bash
# Session 14, call 7: issue 8's sweep on main + serial block shapes (wg64s off), and ncu source-level of the pair attention at batch 64.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv | tee $O/r7_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
SWEEP_STREAMS=1,8,32,64 bash lab/gpu/run_cuda.sh .gpu $O/sweep sweep > $O/r7_sweep_console.log 2>&1
cp $O/sweep/sweep.log $O/r7_sweep.log; cp $O/sweep/fork.log $O/r7_fork.log 2>/dev/null
timeout 200 ncu --graph-profiling node -k "regex:attn_decode_serial_pair" --launch-skip 400 --launch-count 1 --set full --import-source no -o $O/r7_attn \
  .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 24 --prefill "" > $O/r7_ncu_attn.log 2>&1
ncu -i $O/r7_attn.ncu-rep --page details 2>&1 | grep -E 'Duration|DRAM Throughput|Achieved Occupancy|Issued Ipc|Registers Per|Theoretical Occ|L2 Hit|Mem Busy|Max Bandwidth|Executed Ipc|Warp Cycles Per Issued' | head -20 | tee $O/r7_attn_details.txt
ncu -i $O/r7_attn.ncu-rep --page source --print-source sass --csv > /tmp/r7_sass.csv 2>/dev/null
python3 lab/gpu/ncu_sass_summary.py --top 25 /tmp/r7_sass.csv > $O/r7_attn_stalls.txt 2>&1
rm -f $O/r7_attn.ncu-rep
echo "===== summary"
grep -E 'nervactl bench|STREAMS|^ +[0-9]+ +[0-9]' $O/r7_sweep.log | head -12
grep -iE 'fork|x faster|pages' $O/r7_fork.log | head -6
cat $O/r7_attn_details.txt
head -60 $O/r7_attn_stalls.txt
