#!/usr/bin/env bash
# Session 27, call 7 (final source): decode attention's L2 prefetch of the next weights at small
# batches (NERVA_L2_PREFETCH_MIB, off by default since an H100 measurement of the fourth
# session) on the H200 today: batch 1 and 8, 0 / 8 / 24 MiB, alternating.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r7; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
dec() { # name mib
  local t1=$(date +%s)
  NERVA_L2_PREFETCH_MIB=$2 timeout 150 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec warm 0
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 330 ] || break
  dec p0_$r 0
  dec p8_$r 8
  dec p24_$r 24
done
tar czf $OUT/r7.tgz -C $OUT r7
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log)"; grep -E "^\| (1|8) " $O/dec_$f.log; done
