#!/usr/bin/env bash
# Session 20, call 4 (the last of the session's device time): where a 2,048-token prompt goes on
# the final source (ncu per-kernel times over three layers, base clocks, as the nineteenth
# session's call 3), then issue 8's 64-stream load if time is left.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
t1=$(date +%s)
NCU_PREFILL_SKIP=360 NCU_PREFILL_LAUNCHES=30 timeout 200 bash lab/gpu/run_cuda.sh .gpu $O/p ncu-prefill > $O/ncu_prefill_console.log 2>&1
cp $O/p/ncu_prefill_summary.log $O/ncu_prefill_summary.log
rm -rf $O/p
echo "ncu-prefill $(( $(date +%s) - t1 )) s" >> $O/times.txt
if [ $(( $(date +%s) - T0 )) -lt 170 ]; then
  sock=/tmp/nerva-s.sock t1=$(date +%s)
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 > $O/daemon.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
  timeout 70 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/sweep64.json > $O/sweep64.log 2>&1
  kill $pid; wait $pid
  echo "sweep64 $(( $(date +%s) - t1 )) s" >> $O/times.txt
fi
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt $O/ncu_prefill_summary.log
grep -E 'nervactl bench: [0-9]+ streams|rror|TTFT|tok/s' $O/sweep64.log 2>/dev/null | head -8
