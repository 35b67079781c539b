#!/usr/bin/env bash
# Session 19, call 2: the daemon at 64 closed-loop streams with every prompt launch folded
# (NERVA_ATTN_FOLD=1) against none (=0), alternating twice; then 32 and 128 streams each way.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
sw() { # name streams fold
  local name=$1 streams=$2 sock=/tmp/nerva-$1.sock t1=$(date +%s)
  NERVA_ATTN_FOLD=$3 .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 \
    > $O/daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 150 .gpu/nervactl --socket $sock bench --streams $streams --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/sweep_$name.log 2>&1
  kill $pid; wait $pid
  echo "$name $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
sw fold_a 64 1
sw off_a 64 0
sw fold_b 64 1
sw off_b 64 0
sw fold_c 32,128 1
sw off_c 32,128 0
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/times.txt
for f in fold_a off_a fold_b off_b fold_c off_c; do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -4; done
