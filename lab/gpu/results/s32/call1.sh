#!/usr/bin/env bash
# Session 32, call 1: every GPU test (`NERVA_GPU_BIG=1 cuda_backend --test-threads 1`) with the
# residual-add form's deep projections (o and down) five groups ahead
# (NERVA_KERNEL_DEFINES=MMA_DEEP_DEPTH_ADD=5); then qwen3-8b batch 1 and 8 (issue 7's decode,
# prompt 128, 128 timed steps): default / add5 / every deep form at 5 (d5), alternating twice;
# qwen3-0.6b default / add5 once each. The default and d5 kernels compile while the tests run.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
A5="NERVA_KERNEL_DEFINES=MMA_DEEP_DEPTH_ADD=5"
D5="NERVA_KERNEL_DEFINES=MMA_DEEP_DEPTH=5"
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
(timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_base.log 2>&1) &
(env $D5 timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_d5.log 2>&1) &
t1=$(date +%s)
env $A5 NERVA_GPU_BIG=1 timeout 450 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 45 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 500 ] || break
  dec 8b_base_$r qwen3-8b X=0
  dec 8b_add5_$r qwen3-8b $A5
  dec 8b_d5_$r qwen3-8b $D5
done
[ $(( $(date +%s) - T0 )) -lt 560 ] && dec 06b_base qwen3-0.6b X=0
[ $(( $(date +%s) - T0 )) -lt 570 ] && dec 06b_add5 qwen3-0.6b $A5
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked" $O/tests.log
grep -cE "bit-identical" $O/tests.log
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
