#!/usr/bin/env bash
# Session 35, call 3 (diagnostic, main's kernels): the DRAM read timeline of one qwen3-8b decode
# step by ncu's PM sampling (lab/gpu/pm_step.sh) at batch 1 (what is left of the norm-prologue
# dips after the thirty-fourth session's sums) and at batch 64 (where its 7.8 ms step loses
# bandwidth against a ~4.9 ms roofline).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
t1=$(date +%s)
bash lab/gpu/pm_step.sh .gpu $M/qwen3-8b $O/pm_b1 3 7 > $O/pm_b1.log 2>&1
echo "pm_b1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
BATCH=64 bash lab/gpu/pm_step.sh .gpu $M/qwen3-8b $O/pm_b64 6 10 > $O/pm_b64.log 2>&1
echo "pm_b64 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
rm -f $O/*.ncu-rep
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
ls -la $O
python3 lab/gpu/pm_timeline.py $O/pm_b1.csv --layer-ctas 350 --every 2 2>&1 | tail -30
python3 lab/gpu/pm_timeline.py $O/pm_b64.csv 2>&1 | tail -12
