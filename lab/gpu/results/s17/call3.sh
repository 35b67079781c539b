#!/usr/bin/env bash
# Session 15, call 3 (mixed-attn): 64 streams under step budgets 512/768/1536/2048 tokens (1024 in
# call 1), and the fastest mode (cuBLAS prompts, GEMV at 1-2 sequences) at 64 streams, budget 1024.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r3_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
sw() { # name flags
  local name=$1; shift
  sed -i "s/--max-step-tokens [0-9]*/--max-step-tokens ${BUDGET:-1024}/" lab/gpu/run_cuda.sh
  SWEEP_FLAGS="$*" SWEEP_STREAMS=64 SWEEP_FORK=0 SWEEP_TIMEOUT=120 bash lab/gpu/run_cuda.sh .gpu $O/$name sweep > /dev/null 2>&1
  cp $O/$name/sweep.log $O/r3_sweep_$name.log; cp $O/$name/daemon_sweep.log $O/r3_daemon_$name.log; rm -rf $O/$name
}
BUDGET=1024 sw fastest --fast-prefill --projections mixed
for b in 512 768 1536 2048; do BUDGET=$b sw budget$b; done
BUDGET=1024 sw budget1024
echo "===== summary"
for f in fastest budget512 budget768 budget1024 budget1536 budget2048; do echo "-- $f"; grep -E 'nervactl bench: 64' $O/r3_sweep_$f.log; done
