#!/usr/bin/env bash
# Session 23, call 3: 962f0c6 (rope_append one warp per head) + the prefill table's GPU ms:
# the GEMM peak, the decode table, prompts with their steps' GPU time (1,024- and 2,048-token
# budgets, clocks and power sampled meanwhile), every GPU test, issue 8's 64 streams.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 220 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
t1=$(date +%s)
timeout 120 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak.log 2>&1
echo "peak rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 120 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,32,64 --prompt 512 --tokens 64 \
  --prefill 512,2048 --mixed 64:448,64:960 --max-step-tokens 1024 > $O/dec.log 2>&1
echo "dec rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
for step in 1024 2048; do
  t1=$(date +%s)
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader -lms 50 > $O/clocks_$step.csv &
  smi=$!
  timeout 90 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 2048,2040,2032,2024 \
    --max-step-tokens $step > $O/prefill_$step.log 2>&1
  kill $smi
  echo "prefill_$step rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
if [ $(( $(date +%s) - T0 )) -lt 430 ]; then
  sock=/tmp/nerva-s.sock t1=$(date +%s)
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 > $O/daemon.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
  timeout 80 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/sweep64.json > $O/sweep64.log 2>&1
  kill $pid; wait $pid
  echo "sweep64 $(( $(date +%s) - t1 )) s" >> $O/times.txt
fi
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result" $O/tests.log
grep -iE "peak|TFLOP" $O/peak.log | head -3
grep -E "^\| |mixed steps|read bandwidth" $O/dec.log | grep -v "^| batch\|^|---"
for step in 1024 2048; do echo "-- budget $step"; grep -E "^\| [0-9]" $O/prefill_$step.log; done
grep -E 'nervactl bench: [0-9]+ streams|rror|TTFT|tok/s' $O/sweep64.log 2>/dev/null | head -8
