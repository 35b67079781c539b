#!/usr/bin/env bash
# Session 26, call 3 (5c0694d): decode batches with the GEMM's tail plans forced where the cost
# model declines them (gate|up's 192 tiles at 32-64 tokens: one wave whole, the 60 left in 4 or
# 8 splits), through the environment on the same binary, alternating twice.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
t1=$(date +%s)
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t1 )) s" >> $O/times.txt
dec() { # name split
  local t1=$(date +%s)
  if [ $2 = 0 ]; then
    timeout 150 .gpu/gpu_decode --model $M/qwen3-8b --batch 32,48,64 --prompt 512 --tokens 32 --prefill "" > $O/dec_$1.log 2>&1
  else
    NERVA_MMA_GEMM_SPLIT=$2 NERVA_MMA_GEMM_TAIL=1 timeout 150 .gpu/gpu_decode --model $M/qwen3-8b --batch 32,48,64 --prompt 512 --tokens 32 --prefill "" > $O/dec_$1.log 2>&1
  fi
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 300 ] || break
  dec def_$r 0
  dec t4_$r 4
  dec t8_$r 8
done
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| [0-9]|panick|rror" $O/dec_$f.log | head -4; done
