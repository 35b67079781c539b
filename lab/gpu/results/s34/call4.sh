#!/usr/bin/env bash
# Session 34, call 4: the one-tile register projections asking L2 for their next groups before
# pdl_enter (mma.cuh MMA_PREFETCH_GROUPS, a kernel define, 0 by default): 2 (p2) and 4 (p4)
# groups per warp against none (p0), with the norm sums on (the new default). qwen3-8b and
# qwen3-0.6b batch 1 and 8, alternating twice; then the bit-identity test on p2 as far as the time
# allows (a prefetch changes no value; this checks that every address is inside its matrix).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
P2="NERVA_KERNEL_DEFINES=MMA_PREFETCH_GROUPS=2"
P4="NERVA_KERNEL_DEFINES=MMA_PREFETCH_GROUPS=4"
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_p0.log 2>&1 &
env "$P2" timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_p2.log 2>&1 &
env "$P4" timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_p4.log 2>&1 &
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name model env
  local name=$1 model=$2 e=$3
  local t1=$(date +%s)
  env "$e" timeout 45 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  dec 8b_p0_$r qwen3-8b X=0
  dec 8b_p2_$r qwen3-8b "$P2"
  dec 8b_p4_$r qwen3-8b "$P4"
  dec 06b_p0_$r qwen3-0.6b X=0
  dec 06b_p2_$r qwen3-0.6b "$P2"
  dec 06b_p4_$r qwen3-0.6b "$P4"
done
t1=$(date +%s)
left=$(( 450 - (t1 - T0) ))
if [ $left -gt 30 ]; then
  env "$P2" NERVA_GPU_BIG=1 timeout $left .gpu/cuda_backend kernel_variants_give_identical_bits --nocapture > $O/bits.log 2>&1
  echo "bits rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
fi
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked" $O/bits.log 2>/dev/null | cut -c1-200
grep -h -E "rror|panick" $O/warm_*.log | head
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
