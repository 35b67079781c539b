#!/usr/bin/env bash
# Session 17, call 1: --prefill-chunk (prompt tokens per step on top of the decode tokens) at 64
# closed-loop streams (qwen3-8b, 512-token prompts, 256 new tokens, budget 1024), then ncu of a
# batch-64 decode step (per-kernel shares).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r1_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
t0=$(date +%s)
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t0 )) s" >> $O/r1_times.txt
sw() { # name chunk streams spread
  local name=$1 chunk=$2 streams=$3 spread=$4 sock=/tmp/nerva-$1.sock t1=$(date +%s)
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 \
    --prefill-chunk $chunk > $O/r1_daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 150 .gpu/nervactl --socket $sock bench --streams $streams --prompt-tokens 512 --max-tokens 256 \
    --max-tokens-spread $spread --waves 1 --out $O/r1_$name.json > $O/r1_sweep_$name.log 2>&1
  kill $pid; wait $pid
  echo "$name $(( $(date +%s) - t1 )) s" >> $O/r1_times.txt
}
sw c0 0 64 0
sw c512 512 64 0
sw c256 256 64 0
sw c768 768 64 0
sw c512s 512 64 0.5
sw c0s 0 64 0.5
if command -v ncu >/dev/null; then
  timeout 200 ncu --graph-profiling node --launch-skip 11000 --launch-count 420 --metrics gpu__time_duration.sum \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 64 --prefill "" --max-step-tokens 2048 > $O/r1_ncu_step.txt 2>&1
  bash -c 'source <(sed -n "/^ncu_times()/,/^}/p" lab/gpu/run_cuda.sh); ncu_times '$O/r1_ncu_step.txt > $O/r1_ncu_step_summary.log 2>&1
fi
echo "===== summary"
cat $O/r1_times.txt
for f in c0 c512 c256 c768 c512s c0s; do echo "-- $f"; grep -E 'nervactl bench: 64|rror' $O/r1_sweep_$f.log | head -3; done
head -30 $O/r1_ncu_step_summary.log 2>/dev/null
