#!/usr/bin/env bash
# Session 29, call 1: batch-1 and batch-8 decode of qwen3-8b and qwen3-0.6b under one
# shared-memory carveout for every kernel (NERVA_CARVEOUT) and the deep weight ring on launches
# below one wave (NERVA_MMA_RING_DEEP=2) or on all (=1), alternating twice.
#   base: defaults; rd2: ring below one wave; c100: carveout 100%; rd1c: ring everywhere +
#   carveout 100%; rd2c: ring below one wave + carveout 100%.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
timeout 240 .gpu/gpu_decode --model $M/qwen3-0.6b --batch 1 --prompt 16 --tokens 16 --prefill "" > $O/warm.log 2>&1
echo "warm rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 60 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  for m in 06b:qwen3-0.6b 8b:qwen3-8b; do
    [ $(( $(date +%s) - T0 )) -lt 500 ] || break
    s=${m%%:*}; model=${m#*:}
    dec ${s}_base_$r $model X=0
    dec ${s}_rd2_$r $model NERVA_MMA_RING_DEEP=2
    dec ${s}_c100_$r $model NERVA_CARVEOUT=100
    dec ${s}_rd1c_$r $model NERVA_MMA_RING_DEEP=1 NERVA_CARVEOUT=100
    dec ${s}_rd2c_$r $model NERVA_MMA_RING_DEEP=2 NERVA_CARVEOUT=100
  done
done
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log)"; grep -E "^\| (1|8) |rror|WARN" $O/dec_$f.log; done
