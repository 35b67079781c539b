#!/usr/bin/env bash
# Session 36, call 3: the final source. Issue 7's batch-1 figures with the corrected step
# roofline (an untied input embedding table no longer counted): qwen3-8b and qwen3-0.6b through
# a daemon and `nervactl bench`, qwen3-8b in gpu_decode; then every GPU test, the bit-identity
# test included.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
mkdir -p $XDG_CACHE_HOME/nerva && tar xzf .gpu/kcache.tgz -C $XDG_CACHE_HOME/nerva && mv $XDG_CACHE_HOME/nerva/kcache $XDG_CACHE_HOME/nerva/kernels
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 300 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1 &
tests=$!
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
wait $tests
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 60 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prefill "" > $O/bench_qwen3-8b.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
sock=/tmp/nerva-s.sock
for p in qwen3-8b qwen3-0.6b; do
  t1=$(date +%s)
  rm -f $sock
  .gpu/nervad --model $M/$p --socket $sock --backend cuda --max-batch 8 > $O/daemon_$p.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
  timeout 90 .gpu/nervactl --socket $sock bench --procs 1 --streams 1 --prompt-tokens 128 \
    --max-tokens 256 --waves 2 --out $O/client_$p.json > $O/client_$p.log 2>&1
  echo "client_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  kill $pid; wait $pid
done
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked" $O/tests.log | cut -c1-160
grep -E "read bandwidth|weights read|^\| [0-9]" $O/bench_qwen3-8b.log
for p in qwen3-8b qwen3-0.6b; do echo "-- client $p"; grep -E "^ +1 " $O/client_$p.log; done
