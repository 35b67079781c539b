#!/usr/bin/env bash
# Session 18, call 3: why some decode steps are not launched ahead (gpu_decode batch 32/64 with
# the launch-ahead counters), the daemon at 64 closed-loop streams with them in `nervactl
# stats`, and the GPU tests on this source.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
t0=$(date +%s)
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t0 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 200 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,32,64 --prompt 512 --tokens 128 --prefill "" \
  --max-step-tokens 1024 --json > $O/decode.log 2>&1
echo "decode $(( $(date +%s) - t1 )) s" >> $O/times.txt
sock=/tmp/nerva-s.sock; t1=$(date +%s)
.gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 > $O/daemon.log 2>&1 &
pid=$!
for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
timeout 150 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 --waves 1 --out $O/s64.json > $O/sweep.log 2>&1
timeout 30 .gpu/nervactl --socket $sock stats > $O/stats.txt 2>&1
kill $pid; wait $pid
echo "daemon $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 330 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/times.txt
grep -E "bandwidth|^\| |launched ahead|panick|rror" $O/decode.log | head -14
grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep.log | head -4
grep -E "ahead|follow" $O/stats.txt
grep -E "^test |test result" $O/tests.log
