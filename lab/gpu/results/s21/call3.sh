#!/usr/bin/env bash
# Session 19, call 3: where a 2,048-token prompt goes with the folded prompt attention (ncu
# per-kernel times over three layers), and attn_prefill_fold under ncu --set full with its
# source-level stalls (one launch of the 2,048-token prompt).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
t1=$(date +%s)
NCU_PREFILL_SKIP=360 NCU_PREFILL_LAUNCHES=30 bash lab/gpu/run_cuda.sh .gpu $O/p ncu-prefill > $O/ncu_prefill_console.log 2>&1
cp $O/p/ncu_prefill_summary.log $O/ncu_prefill_summary.log
echo "ncu-prefill $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 240 ncu --graph-profiling node -k "regex:attn_prefill_fold" --launch-skip 50 --launch-count 1 --set full --import-source no -o $O/fold \
  .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 2048 > $O/ncu_fold.log 2>&1
ncu -i $O/fold.ncu-rep --page details 2>&1 | grep -E 'Duration|DRAM Throughput|Achieved Occupancy|Issued Ipc|Registers Per|Theoretical Occ|L2 Hit|Mem Busy|Max Bandwidth|Executed Ipc|Warp Cycles Per Issued|Compute \(SM\)|Pipe|Tensor' | head -30 | tee $O/fold_details.txt
ncu -i $O/fold.ncu-rep --page details --print-details all 2>&1 | grep -iE 'stall|inst|pipe' | head -60 > $O/fold_details_more.txt
ncu -i $O/fold.ncu-rep --page source --print-source sass --csv > /tmp/fold_sass.csv 2>/dev/null
python3 lab/gpu/ncu_sass_summary.py --top 30 /tmp/fold_sass.csv > $O/fold_stalls.txt 2>&1
rm -f $O/fold.ncu-rep
echo "ncu-fold $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/times.txt
cat $O/ncu_prefill_summary.log
cat $O/fold_details.txt
head -70 $O/fold_stalls.txt
