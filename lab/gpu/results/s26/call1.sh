#!/usr/bin/env bash
# Session 26, call 1: GEMM tail plans (whole waves of tiles in one block each, only the last
# partial wave's tiles chain-split; same bits): the bit tests, then the same binary with
# NERVA_MMA_GEMM_TAIL=0 (off) and default (on): the GEMMs per projection at 512-2,048 tokens, and
# whole steps (64 decode + 512 prompt tokens, as in the closed loop) alternating twice.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 250 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
for p in 0 1; do
  t1=$(date +%s)
  NERVA_MMA_GEMM_TAIL=$p timeout 80 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 576,1088,2048 --only qwen3-8b > $O/kernels_t$p.log 2>&1
  echo "kernels_t$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
dec() { # name tail
  local t1=$(date +%s)
  NERVA_MMA_GEMM_TAIL=$2 timeout 80 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 32 \
    --prefill 2048 --mixed 64:512,32:512,64:1024 --max-step-tokens 2048 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 470 ] || break
  dec off_$r 0
  dec on_$r 1
done
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick|differ" $O/bits.log | head -20
for p in 0 1; do echo "-- kernels t$p"; grep -E "qwen3-8b .* (576|1088|2048) \||peak" $O/kernels_t$p.log | grep -v GEMV | head -14; done
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| |panick|rror" $O/dec_$f.log | grep -v "^| batch\|^| prompt\|^|---" | head -8; done
