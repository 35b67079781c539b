#!/usr/bin/env bash
# Session 17, call 2: the follow-up hold (new nervad) against no hold (nervad_nohold: the same
# source with FOLLOW_UP_HOLD = 0), both with --prefill-chunk 512 (the new default), 8/32/64
# closed-loop streams, alternating; then the hold with chunk 0 at 64 streams.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r2_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
sw() { # name binary chunk streams
  local name=$1 bin=$2 chunk=$3 streams=$4 sock=/tmp/nerva-$1.sock t1=$(date +%s)
  $bin --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 \
    --prefill-chunk $chunk > $O/daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 150 .gpu/nervactl --socket $sock bench --streams $streams --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/sweep_$name.log 2>&1
  kill $pid; wait $pid
  echo "$name $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
sw nohold_a .gpu/nervad_nohold 512 8,32,64
sw hold_a .gpu/nervad 512 8,32,64
sw nohold_b .gpu/nervad_nohold 512 64
sw hold_b .gpu/nervad 512 64
sw hold_c0 .gpu/nervad 0 64
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/times.txt
for f in nohold_a hold_a nohold_b hold_b hold_c0; do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -4; done
