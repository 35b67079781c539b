#!/usr/bin/env bash
# Session 25, call 3, d418c82 (wgs/wgt persistent by default then): every GPU test, the GEMM peak
# before and after, the decode and prompt table (prompt TFLOP/s now printed), a lone
# 2,048-token prompt through a real client on the daemon's defaults, and issue 8's 64 streams.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 340 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
peak() {
  local t1=$(date +%s)
  timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak_$1.log 2>&1
  echo "peak_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
peak a
t1=$(date +%s)
timeout 90 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,32,64 --prompt 512 --tokens 64 \
  --prefill 512,2048 --mixed 64:448,64:960 --max-step-tokens 2048 > $O/dec.log 2>&1
echo "dec rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
peak b
sock=/tmp/nerva-s.sock
daemon() { # flags...
  rm -f $sock
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda "$@" > $O/daemon_$tag.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
}
if [ $(( $(date +%s) - T0 )) -lt 470 ]; then
  tag=lone t1=$(date +%s)
  daemon
  timeout 40 .gpu/nervactl --socket $sock bench --procs 1 --streams 1 --prompt-tokens 2048 \
    --max-tokens 8 --waves 4 --out $O/lone.json > $O/lone.log 2>&1
  kill $pid; wait $pid
  echo "lone $(( $(date +%s) - t1 )) s" >> $O/times.txt
fi
if [ $(( $(date +%s) - T0 )) -lt 500 ]; then
  tag=sweep64 t1=$(date +%s)
  daemon --max-batch 256
  timeout 70 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/sweep64.json > $O/sweep64.log 2>&1
  kill $pid; wait $pid
  echo "sweep64 $(( $(date +%s) - t1 )) s" >> $O/times.txt
fi
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result" $O/tests.log
grep -iE "peak" $O/peak_*.log | head -3
grep -E "^\| [0-9]|mixed steps|read bandwidth" $O/dec.log
echo "-- lone prompt"; grep -E 'stream|TTFT|rror' $O/lone.log | head -6
grep -E 'stream|rror|TTFT|tok/s' $O/sweep64.log 2>/dev/null | head -8
