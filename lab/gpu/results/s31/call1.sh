#!/usr/bin/env bash
# Session 31, call 1: the bulk weight ring (n1b, n1db, n1hb: one bulk copy per 16 KiB stage by a
# producer warp instead of per-lane cp.async or registers). The bit-identity test's bulk
# variant on every preset; the one-token projections alone (gpu_kernels, defaults / cp.async
# ring everywhere / bulk ring everywhere); then batch-1 and batch-8 decode of qwen3-8b and
# qwen3-0.6b, alternating twice:
#   base: defaults; bd: the bulk ring on the deep launches (o, down); ba: on every one-n-tile
#   launch.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
t1=$(date +%s)
NERVA_GPU_BIG=1 NERVA_GPU_VARIANTS='bulk' timeout 300 .gpu/cuda_backend kernel_variants_give_identical_bits \
  --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
kern() { # name env...
  local name=$1; shift
  local t1=$(date +%s)
  env "$@" timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1,8 --gemm-tokens "" --only qwen3- > $O/kernels_$name.log 2>&1
  echo "kernels_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
kern base X=0
kern ring NERVA_MMA_RING=1 NERVA_MMA_RING_DEEP=1
kern bulk NERVA_MMA_RING=1 NERVA_MMA_RING_DEEP=1 NERVA_MMA_RING_BULK=1
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 60 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  for m in 8b:qwen3-8b 06b:qwen3-0.6b; do
    [ $(( $(date +%s) - T0 )) -lt 500 ] || break
    s=${m%%:*}; model=${m#*:}
    dec ${s}_base_$r $model X=0
    dec ${s}_bd_$r $model NERVA_MMA_RING_DEEP=1 NERVA_MMA_RING_BULK=1
    dec ${s}_ba_$r $model NERVA_MMA_RING=1 NERVA_MMA_RING_DEEP=1 NERVA_MMA_RING_BULK=1
  done
done
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|differ|panicked|bulk" $O/tests.log | head -20
for f in base ring bulk; do echo "-- kernels $f"; grep -E "read bandwidth|^qwen3.* (1|8) \|" $O/kernels_$f.log | grep -v GEMV | head -14; done
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
