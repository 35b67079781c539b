#!/usr/bin/env bash
# Session 24, call 5, the final source (6898e8f): every GPU test, the GEMM peak, the decode and
# prompt table at the default budget, issue 8's 64 streams on the daemon's defaults.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r5; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 340 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
t1=$(date +%s)
timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak.log 2>&1
echo "peak rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 90 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,32,64 --prompt 512 --tokens 64 \
  --prefill 512,2048 --mixed 64:448,64:960 --max-step-tokens 2048 > $O/dec.log 2>&1
echo "dec rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
sock=/tmp/nerva-s.sock t1=$(date +%s)
.gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 > $O/daemon.log 2>&1 &
pid=$!
for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
timeout 70 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
  --waves 1 --out $O/sweep64.json > $O/sweep64.log 2>&1
kill $pid; wait $pid
echo "sweep64 $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r5.tgz -C $OUT r5
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result" $O/tests.log
grep -iE "peak" $O/peak.log | head -3
grep -E "^\| [0-9]|mixed steps|read bandwidth" $O/dec.log
grep -E 'streams:|rror' $O/sweep64.log | head -4; sed -n 4p $O/sweep64.log
