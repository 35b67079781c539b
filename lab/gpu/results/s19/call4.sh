#!/usr/bin/env bash
# Session 17, call 4: the GPU tests, then issue 8's sweep with the prompt chunk lifted past 4 waiting
# prompts (measured, not kept; otherwise the final source) at 1/8/32/64/128/256 streams with the
# fork and the engine's stats, and the fastest mode at 64.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r4_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
( [ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null; touch $M/ready ) &
( time NERVA_GPU_BIG=1 timeout 280 .gpu/cuda_backend --nocapture --test-threads 1 ) > $O/tests.log 2>&1
while [ ! -f $M/ready ]; do sleep 2; done
sw() { # name streams fork daemon-flags...
  local name=$1 streams=$2 fork=$3 sock=/tmp/nerva-$1.sock t1=$(date +%s); shift 3
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 "$@" \
    > $O/daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 170 .gpu/nervactl --socket $sock bench --streams $streams --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/sweep_$name.log 2>&1
  [ $fork = 1 ] && timeout 60 .gpu/nervactl --socket $sock bench --fork 32 --prompt-tokens 512 \
    --max-tokens 128 --out $O/fork_$name.json > $O/fork_$name.log 2>&1
  timeout 30 .gpu/nervactl --socket $sock stats > $O/stats_$name.txt 2>&1
  kill $pid; wait $pid
  echo "$name $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
sw adaptive 1,8,32,64,128,256 1
sw fastest 64 0 --fast-prefill --projections mixed
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
grep -E '^test |test result|real|differs|panicked' $O/tests.log | cut -c1-160
cat $O/times.txt
for f in adaptive fastest; do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -6; done
grep -E "^fork|^sequential|^at_once|over_fork" $O/fork_adaptive.log | head -8
grep -E "follow_up|preemptions" $O/stats_adaptive.txt
