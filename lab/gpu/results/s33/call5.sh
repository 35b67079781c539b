#!/usr/bin/env bash
# Session 33, call 5: the norm prologue of the one-n-tile projections with each row staged in
# shared memory by cp.async (rows_rms_inv_staged, the new default: one L2 round trip per row)
# against the chunk-by-chunk walk (NERVA_KERNEL_DEFINES=MMA_RMS_STAGE=0: four round trips at
# K = 4,096), found by call 4's DRAM timeline (HBM idle ~5 us at the start of q|k|v and gate|up).
# qwen3-8b and qwen3-0.6b batch 1 and 8, alternating twice; then the bit-identity test and the
# rest of the GPU suite on the default, as far as the time allows.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r5; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
S0="NERVA_KERNEL_DEFINES=MMA_RMS_STAGE=0"
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1 &
env $S0 timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_s0.log 2>&1 &
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 45 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  dec 8b_s0_$r qwen3-8b $S0
  dec 8b_st_$r qwen3-8b X=0
  dec 06b_s0_$r qwen3-0.6b $S0
  dec 06b_st_$r qwen3-0.6b X=0
done
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 200 .gpu/cuda_backend kernel_variants_give_identical_bits --nocapture > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
left=$(( 560 - (t1 - T0) ))
NERVA_GPU_BIG=1 timeout $left .gpu/cuda_backend --nocapture --test-threads 1 --skip kernel_variants_give_identical_bits > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
tar czf $OUT/r5.tgz -C $OUT r5
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked" $O/bits.log $O/tests.log | cut -c1-200
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
