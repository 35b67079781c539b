#!/usr/bin/env bash
# Session 35, call 1: attn_decode_serial's ring of three half-tiles per warp (tensor copies;
# ATTN_SERIAL_RING=3, new default) against two (the previous staging), the same binary, kernels
# built with each define: qwen3-8b decode steps at batch 8, 32, 64 over 512-token prompts,
# alternating twice. Then inputs normalized in the projections at 3-8 tokens now that the adds
# leave their sums (NERVA_MMA_PREPARED=0) against to_half (default 3): batch 1, 4, 8. Then the
# bit-identity test on the new default.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
R2="NERVA_KERNEL_DEFINES=ATTN_SERIAL_RING=2"
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_r3.log 2>&1 &
env "$R2" timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_r2.log 2>&1 &
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name env args...
  local name=$1 e=$2; shift 2
  local t1=$(date +%s)
  env "$e" timeout 60 .gpu/gpu_decode --model $M/qwen3-8b --prefill "" "$@" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  dec r3_$r X=0 --batch 8,32,64 --prompt 512 --tokens 16
  dec r2_$r "$R2" --batch 8,32,64 --prompt 512 --tokens 16
done
for r in a b; do
  dec p3_$r X=0 --batch 1,4,8 --prompt 128 --tokens 128
  dec p0_$r NERVA_MMA_PREPARED=0 --batch 1,4,8 --prompt 128 --tokens 128
done
t1=$(date +%s)
left=$(( 590 - (t1 - T0) ))
NERVA_GPU_BIG=1 timeout $left .gpu/cuda_backend kernel_variants_give_identical_bits --nocapture > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -h -E "rror|panick" $O/warm_*.log | head
grep -E "^test |test result|panicked|differ" $O/bits.log | cut -c1-200 | head -20
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| [0-9]+ \||rror|WARN|panick" $O/dec_$f.log; done
