#!/usr/bin/env bash
# Session 35, call 2: the read test over the device arena (8 GiB in the daemon, gpu_decode's
# 1 and 8 GiB buffers no longer clamped to a small KV pool); issue 7's batch-1 decode of qwen3-8b
# and qwen3-0.6b (prompt 128, 256 new tokens) in gpu_decode and through a real client (daemon
# --max-batch 8, `nervactl bench --streams 1`), issue 8's 64 streams (daemon --max-batch 256
# --max-step-tokens 1024, 512-token prompts, 256 new tokens), then the GPU suite (the kernels
# are main's: the bit-identity test ran on them in call 1 and the thirty-fourth session).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
for p in qwen3-8b qwen3-0.6b; do
  t1=$(date +%s)
  timeout 60 .gpu/gpu_decode --model $M/$p --batch 1,8 --prefill "" > $O/bench_$p.log 2>&1
  echo "bench_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
sock=/tmp/nerva-s.sock
daemon() { # name model flags...
  local name=$1 p=$2; shift 2
  local t1=$(date +%s)
  rm -f $sock
  .gpu/nervad --model $M/$p --socket $sock --backend cuda "$@" > $O/daemon_$name.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
  echo "daemon_$name up after $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for p in qwen3-8b qwen3-0.6b; do
  daemon $p $p --max-batch 8
  t1=$(date +%s)
  timeout 90 .gpu/nervactl --socket $sock bench --procs 1 --streams 1 --prompt-tokens 128 \
    --max-tokens 256 --waves 2 --out $O/client_$p.json > $O/client_$p.log 2>&1
  echo "client_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  kill $pid; wait $pid
done
daemon s64 qwen3-8b --max-batch 256 --max-step-tokens 1024
t1=$(date +%s)
timeout 120 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
  --waves 1 --out $O/s64.json > $O/s64.log 2>&1
echo "s64 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
kill $pid; wait $pid
t1=$(date +%s)
left=$(( 590 - (t1 - T0) ))
NERVA_GPU_BIG=1 timeout $left .gpu/cuda_backend --nocapture --test-threads 1 --skip kernel_variants_give_identical_bits > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked" $O/tests.log | cut -c1-200
grep -h "read bandwidth measured" $O/daemon_*.log | cut -c1-200
for p in qwen3-8b qwen3-0.6b; do echo "-- bench $p"; grep -E "read bandwidth|weights read|^\| [0-9]" $O/bench_$p.log; echo "-- client $p"; grep -vE "^\s*$" $O/client_$p.log | tail -8; done
echo "-- 64 streams"; grep -vE "^\s*$" $O/s64.log | tail -10
