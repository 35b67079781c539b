#!/usr/bin/env bash
# Session 15, call 5 (main 8074aca): issue 8's sweep at 128 and 256 streams; 64 streams under a
# 768-token step budget again (call 3 had it once).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r5_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
SWEEP_STREAMS=128,256 SWEEP_FORK=0 SWEEP_TIMEOUT=330 bash lab/gpu/run_cuda.sh .gpu $O/sw sweep > /dev/null 2>&1
cp $O/sw/sweep.log $O/r5_sweep.log; cp $O/sw/daemon_sweep.log $O/r5_daemon_sweep.log; cp $O/sw/sweep.json $O/r5_sweep.json; rm -rf $O/sw
sed -i "s/--max-step-tokens [0-9]*/--max-step-tokens 768/" lab/gpu/run_cuda.sh
SWEEP_STREAMS=64 SWEEP_FORK=0 SWEEP_TIMEOUT=100 bash lab/gpu/run_cuda.sh .gpu $O/sw sweep > /dev/null 2>&1
cp $O/sw/sweep.log $O/r5_sweep_budget768.log; rm -rf $O/sw
echo "===== summary"
grep -E 'nervactl bench: |STREAMS|^ +[0-9]+ +[0-9]' $O/r5_sweep.log | cut -c1-250
grep -E 'nervactl bench: 64' $O/r5_sweep_budget768.log
