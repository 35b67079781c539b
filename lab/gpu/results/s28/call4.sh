#!/usr/bin/env bash
# Session 28, call 4 (the deep one-n-tile projections' weight ring, n1dr, on by default; n1r /
# n1hr opt-in): every GPU test; batch-1 and batch-8 decode of qwen3-8b and qwen3-0.6b with the
# deep ring off (d0, NERVA_MMA_RING_DEEP=0) and on (d1, the default), alternating twice; the
# 8B's o and down projections alone at one token.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null) &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 390 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
dec() { # name model deep
  local t1=$(date +%s)
  NERVA_MMA_RING_DEEP=$3 timeout 60 .gpu/gpu_decode --model $M/$2 --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 420 ] || break
  dec 8b_d0_$r qwen3-8b 0
  dec 8b_d1_$r qwen3-8b 1
  dec 06b_d0_$r qwen3-0.6b 0
  dec 06b_d1_$r qwen3-0.6b 1
done
if [ $(( $(date +%s) - T0 )) -lt 490 ]; then
  timeout 40 stdbuf -oL .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only qwen3-8b/down > $O/kernels_down.log 2>&1
  echo "kernels rc=$?" >> $O/times.txt
fi
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result" $O/tests.log
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log)"; grep -E "^\| (1|8) |rror|WARN" $O/dec_$f.log; done
grep -E "qwen3-8b" $O/kernels_down.log
