#!/usr/bin/env bash
# Session 14, call 9: issue 8's sweep at 128 and 256 streams on the final defaults (not run since the third session).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv | tee $O/r9_gpu.txt
SWEEP_STREAMS=128,256 SWEEP_FORK=0 SWEEP_TIMEOUT=330 bash lab/gpu/run_cuda.sh .gpu $O/sweep sweep > $O/r9_sweep_console.log 2>&1
cp $O/sweep/sweep.log $O/r9_sweep.log
echo "===== summary"; grep -E 'nervactl bench:|STREAMS|^ +[0-9]+ +[0-9]|roofline:' $O/r9_sweep.log | head -12
grep -iE 'preempt|queue|pages' $O/r9_sweep.log | tail -12
