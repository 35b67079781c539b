#!/usr/bin/env bash
# Session 31, call 2: the one-n-tile projections' inputs prefetched into L1 (mma.cuh
# MMA_PREFETCH_X; NERVA_KERNEL_DEFINES=MMA_PREFETCH_X=1 compiles the variant beside the default
# kernels, one binary). The projections alone (gpu_kernels, 1 and 8 tokens), then batch-1 and
# batch-8 decode of qwen3-8b and qwen3-0.6b, base / pf alternating twice; then, time left, ncu's
# warp states of the 8B's down projection at one token (n1d), base and pf.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
PF="NERVA_KERNEL_DEFINES=MMA_PREFETCH_X=1"
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 240 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_base.log 2>&1 &
env $PF timeout 240 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_pf.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
kern() { # name env...
  local name=$1; shift
  local t1=$(date +%s)
  env "$@" timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1,8 --gemm-tokens "" --only qwen3- > $O/kernels_$name.log 2>&1
  echo "kernels_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
kern base X=0
kern pf $PF
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 60 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  for m in 8b:qwen3-8b 06b:qwen3-0.6b; do
    [ $(( $(date +%s) - T0 )) -lt 420 ] || break
    s=${m%%:*}; model=${m#*:}
    dec ${s}_base_$r $model X=0
    dec ${s}_pf_$r $model $PF
  done
done
for c in base:X=0 pf:$PF; do
  [ $(( $(date +%s) - T0 )) -lt 470 ] || break
  t1=$(date +%s)
  env ${c#*:} timeout 60 ncu --clock-control none -k regex:mma_plain_add_bf16_n1d --launch-count 1 \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section SpeedOfLight \
    .gpu/gpu_kernels --tokens "" --mma-tokens 1 --gemm-tokens "" --only qwen3-8b/down > $O/ncu_${c%%:*}.txt 2>&1
  echo "ncu_${c%%:*} rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for f in base pf; do echo "-- kernels $f"; grep -E "read bandwidth|^qwen3-\S+ +\S+ +(1|8) \|" $O/kernels_$f.log | head -24; done
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
for f in base pf; do echo "-- ncu $f"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Stall|cycles being stalled|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit" $O/ncu_$f.txt | head -20; done
