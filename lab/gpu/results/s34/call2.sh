#!/usr/bin/env bash
# Session 34, call 2: the norm prologues reading the residual adds' chunk sums of squares
# (KernelTuning::norm_sums_from, on by default from 2,048 columns) against reading the rows
# (NERVA_NORM_SUMS=0), the same binary and kernels: qwen3-8b (hidden 4,096: four round trips ->
# one) and llama3-1b (2,048: two -> one) at batch 1 and 8, alternating twice; then the
# bit-identity test and the rest of the GPU suite on the new default.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset llama3-1b --out $M/llama3-1b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
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
  dec 8b_off_$r qwen3-8b NERVA_NORM_SUMS=0
  dec 8b_on_$r qwen3-8b X=0
  dec 1b_off_$r llama3-1b NERVA_NORM_SUMS=0
  dec 1b_on_$r llama3-1b X=0
done
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 200 .gpu/cuda_backend kernel_variants_give_identical_bits --nocapture > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
left=$(( 585 - (t1 - T0) ))
NERVA_GPU_BIG=1 timeout $left .gpu/cuda_backend --nocapture --test-threads 1 --skip kernel_variants_give_identical_bits > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked|norm sums" $O/bits.log $O/tests.log | cut -c1-220
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
