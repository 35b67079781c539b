#!/usr/bin/env bash
# Session 28, call 3 (the weight ring as separate kernels n1r / n1dr / n1hr, 3 groups per warp
# for n1 and n1h, 4 for n1d, the carveout sized to fit their blocks): its bit-identity variants
# (Tiny, TinyLlama, qwen3-0.6b against the baseline), then batch-1 and batch-8 decode of
# qwen3-8b and qwen3-0.6b: ring off (r0), on for n1/n1h (r1), on for n1d too (rd), alternating.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null) &
t1=$(date +%s)
NERVA_GPU_BIG=1 NERVA_GPU_VARIANTS="weight ring" timeout 280 .gpu/cuda_backend kernel_variants --nocapture --test-threads 1 > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
echo "models $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name model ring deep
  local t1=$(date +%s)
  NERVA_MMA_RING=$3 NERVA_MMA_RING_DEEP=$4 timeout 100 .gpu/gpu_decode --model $M/$2 --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 430 ] || break
  dec 8b_r0_$r qwen3-8b 0 0
  dec 8b_r1_$r qwen3-8b 1 0
  dec 8b_rd_$r qwen3-8b 1 1
  dec 06b_r0_$r qwen3-0.6b 0 0
  dec 06b_r1_$r qwen3-0.6b 1 0
  dec 06b_rd_$r qwen3-0.6b 1 1
done
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "bit-identical|panicked|differs|test result|skip" $O/bits.log | cut -c1-150
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log)"; grep -E "^\| (1|8) |rror|WARN" $O/dec_$f.log; done
