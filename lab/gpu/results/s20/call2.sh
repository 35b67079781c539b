#!/usr/bin/env bash
# Session 18, call 2: (a) gpu_decode with per-collected-step accounting (batch 32/64, and mixed
# steps 64:64/448/512: what a step of 64 decode tokens and a few prompt tokens costs); (b) the
# daemon at 64 closed-loop streams with prompt chunks cut back to end steps on a 128-token tile
# (--step-tile 128, the new default) against --step-tile 0, and against a 512-token step budget,
# alternating; then 32 and 128 streams, tile against none.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
t0=$(date +%s)
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t0 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 200 .gpu/gpu_decode --model $M/qwen3-8b --batch 32,64 --prompt 512 --tokens 128 --prefill "" \
  --mixed 64:64,64:448,64:512 --max-step-tokens 1024 --json > $O/decode.log 2>&1
echo "decode $(( $(date +%s) - t1 )) s" >> $O/times.txt
sw() { # name streams daemon-flags...
  local name=$1 streams=$2 sock=/tmp/nerva-$1.sock t1=$(date +%s); shift 2
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 "$@" \
    > $O/daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 150 .gpu/nervactl --socket $sock bench --streams $streams --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/sweep_$name.log 2>&1
  timeout 30 .gpu/nervactl --socket $sock stats > $O/stats_$name.txt 2>&1
  kill $pid; wait $pid
  echo "$name $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
sw none_a 64 --max-step-tokens 1024 --step-tile 0
sw tile_a 64 --max-step-tokens 1024
sw b512_a 64 --max-step-tokens 512 --step-tile 0
sw none_b 64 --max-step-tokens 1024 --step-tile 0
sw tile_b 64 --max-step-tokens 1024
sw b512_b 64 --max-step-tokens 512 --step-tile 0
sw none_c 32,128 --max-step-tokens 1024 --step-tile 0
sw tile_c 32,128 --max-step-tokens 1024
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/times.txt
grep -E "bandwidth|^\| |mixed steps|panick|rror" $O/decode.log | head -14
for f in none_a tile_a b512_a none_b tile_b b512_b none_c tile_c; do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -4; done
