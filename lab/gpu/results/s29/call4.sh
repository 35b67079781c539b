#!/usr/bin/env bash
# Session 29, call 4: the deep one-n-tile projections' threshold, NERVA_MMA_DEEP=1|2|3 (deep
# where a launch has at most that many 16-row blocks per SM; 2 is the default), batch-1 and
# batch-8 decode of qwen3-0.6b and qwen3-8b, alternating twice (as call 1).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
timeout 200 .gpu/gpu_decode --model $M/qwen3-0.6b --batch 1 --prompt 16 --tokens 16 --prefill "" > $O/warm.log 2>&1
echo "warm rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 40 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  for m in 06b:qwen3-0.6b 8b:qwen3-8b; do
    s=${m%%:*}; model=${m#*:}
    for d in 2 1 3; do
      [ $(( $(date +%s) - T0 )) -lt 310 ] || break 3
      dec ${s}_d${d}_$r $model NERVA_MMA_DEEP=$d
    done
  done
done
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log)"; grep -E "^\| (1|8) |rror|WARN" $O/dec_$f.log; done
