#!/usr/bin/env bash
# Session 17, call 3: the engine plans after taking the commands that came in during a collect,
# and holds a launch ahead for follow-up requests (new nervad, default --prefill-chunk 512),
# against nervad_nohold (chunk 512 without either), alternating; then the new one with chunk 0
# at 64 streams, at 128/256 streams, and the 32-sample fork.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r3_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
sw() { # name binary streams fork daemon-flags...
  local name=$1 bin=$2 streams=$3 fork=$4 sock=/tmp/nerva-$1.sock t1=$(date +%s); shift 4
  $bin --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 "$@" \
    > $O/daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 200 .gpu/nervactl --socket $sock bench --streams $streams --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/sweep_$name.log 2>&1
  [ $fork = 1 ] && timeout 120 .gpu/nervactl --socket $sock bench --fork 32 --prompt-tokens 512 \
    --max-tokens 128 --out $O/fork_$name.json > $O/fork_$name.log 2>&1
  timeout 30 .gpu/nervactl --socket $sock stats > $O/stats_$name.txt 2>&1
  kill $pid; wait $pid
  echo "$name $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
sw old_a .gpu/nervad_nohold 1,8,32,64 0 --prefill-chunk 512
sw new_a .gpu/nervad 1,8,32,64 0
sw old_b .gpu/nervad_nohold 64 0 --prefill-chunk 512
sw new_b .gpu/nervad 64 0
sw new_c0 .gpu/nervad 64 0 --prefill-chunk 0
sw new_big .gpu/nervad 128,256 1
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/times.txt
for f in old_a new_a old_b new_b new_c0 new_big; do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -4; done
grep -E "fork|sequential|at once|×" $O/fork_new_big.log | head -8
