#!/usr/bin/env bash
# Session 25, call 4 (H100): the warp-specialized wgmma GEMM persistent (one block per SM walking its
# tiles; same bits, tested on the H200): the prompt GEMMs per projection with NERVA_WG_PERSISTENT=0
# and on, then whole steps of the same binary off/on alternating twice. (kernels_p0 was cut at
# its limit while its kernels compiled cold.)
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
wait
echo "model $(( $(date +%s) - T0 )) s" >> $O/times.txt
for p in 0 1; do
  t1=$(date +%s)
  NERVA_WG_PERSISTENT=$p timeout 90 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 512,2048 --only qwen3-8b > $O/kernels_p$p.log 2>&1
  echo "kernels_p$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
dec() { # name persistent
  local t1=$(date +%s)
  NERVA_WG_PERSISTENT=$2 timeout 200 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,64 --prompt 512 --tokens 64 \
    --prefill 512,2048 --mixed 64:960 --max-step-tokens 2048 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 420 ] || break
  dec off_$r 0
  dec on_$r 1
done
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for p in 0 1; do echo "-- kernels p$p"; grep -E "qwen3-8b .* (512|2048) \||peak" $O/kernels_p$p.log | grep -v GEMV | head -12; done
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| |panick|rror|mixed step" $O/dec_$f.log | grep -v "^| batch\|^| prompt\|^|---" | head -8; done
