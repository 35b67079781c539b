#!/usr/bin/env bash
# Session 32, call 2: the persistent one-n-tile projections (n1p, n1hp: NERVA_MMA_PERSISTENT=1).
# The projections alone at 1 and 8 tokens (gpu_kernels, default / persistent); qwen3-8b and
# qwen3-0.6b batch 1 and 8 (issue 7's decode, prompt 128, 128 timed steps), default /
# persistent alternating twice; then the bit-identity test (its two persistent variants on
# Tiny, TinyLlama, qwen3-0.6b, qwen2.5-0.5b).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
P1="NERVA_MMA_PERSISTENT=1"
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
for p in 0 1; do
  env NERVA_MMA_PERSISTENT=$p timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1,8 --gemm-tokens "" --only qwen3- > $O/kernels_p$p.log 2>&1
done
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 45 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  dec 8b_p0_$r qwen3-8b X=0
  dec 8b_p1_$r qwen3-8b $P1
  dec 06b_p0_$r qwen3-0.6b X=0
  dec 06b_p1_$r qwen3-0.6b $P1
done
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout $(( 560 - (t1 - T0) )) .gpu/cuda_backend kernel_variants_give_identical_bits --nocapture > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "persistent|test result|panicked" $O/bits.log | cut -c1-220
for p in 0 1; do echo "-- kernels p$p"; grep -E "^qwen3" $O/kernels_p$p.log | awk -F'|' '{print $1 "|" $4}'; done
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
