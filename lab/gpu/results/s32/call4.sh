#!/usr/bin/env bash
# Session 32, call 4, the final kernels: issue 7's decode through a real client. Per model
# (qwen3-0.6b, then qwen3-8b) a daemon on CUDA with its defaults and --max-batch 8, and one
# client process of `nervactl bench --streams 1,8` (closed loop, 128-token prompts of token ids,
# 256 new tokens, two measured waves after the first), then `nervactl stats`.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
sock=/tmp/nerva-s.sock
for p in qwen3-0.6b qwen3-8b; do
  [ $p = qwen3-8b ] && wait
  left=$(( 320 - ($(date +%s) - T0) ))
  [ $left -gt 40 ] || break
  t1=$(date +%s)
  rm -f $sock
  .gpu/nervad --model $M/$p --socket $sock --backend cuda --max-batch 8 > $O/daemon_$p.log 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do [ -S $sock ] && break; sleep 1; done
  echo "daemon_$p up after $(( $(date +%s) - t1 )) s" >> $O/times.txt
  timeout $(( 320 - ($(date +%s) - T0) )) .gpu/nervactl --socket $sock bench --procs 1 --streams 1,8 \
    --prompt-tokens 128 --max-tokens 256 --waves 2 --out $O/client_$p.json > $O/client_$p.log 2>&1
  echo "client_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  timeout 20 .gpu/nervactl --socket $sock stats > $O/stats_$p.log 2>&1
  kill $pid; wait $pid
done
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for p in qwen3-0.6b qwen3-8b; do echo "-- $p"; grep -vE "^\s*$" $O/client_$p.log | tail -14; done
