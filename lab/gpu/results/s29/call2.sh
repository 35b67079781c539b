#!/usr/bin/env bash
# Session 29, call 2 (the deep weight ring below one wave on by default): every GPU test; then
# batch-1 and batch-8 decode of qwen3-0.6b and qwen3-8b, the same binary under:
#   def: defaults; rd0: NERVA_MMA_RING_DEEP=0 (the old default); c60rd1: carveout 60% for every
#   kernel (the deep ring's own) + the deep ring on every launch; c60: carveout 60% alone;
#   c0: carveout 0%; r2: the plain ring (n1r, n1hr) below one wave too.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null) &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 360 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
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
    s=${m%%:*}; model=${m#*:}
    for c in def:X=0 rd0:NERVA_MMA_RING_DEEP=0 c60rd1:NERVA_CARVEOUT=60,NERVA_MMA_RING_DEEP=1 \
             c60:NERVA_CARVEOUT=60 c0:NERVA_CARVEOUT=0 r2:NERVA_MMA_RING=2; do
      [ $(( $(date +%s) - T0 )) -lt 545 ] || break 3
      dec ${s}_${c%%:*}_$r $model $(echo ${c#*:} | tr , ' ')
    done
  done
done
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result" $O/tests.log
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log)"; grep -E "^\| (1|8) |rror|WARN" $O/dec_$f.log; done
