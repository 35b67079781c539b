#!/usr/bin/env bash
# Session 36, call 1: the kernel cache filled here ahead of time (`nervad compile-kernels --arch
# 90`, carried as .gpu/kcache.tgz) instead of compiled at start; the projections at 64-512
# tokens against cuBLAS; mixed steps (64 decode tokens + a prompt chunk of 64-512); issue 7
# through a client (qwen3-8b, qwen3-0.6b); issue 8's 64 streams with prompt chunks of 512 (the
# default), 256 and 128, and the fastest mode; then the sweep 1..256 streams if time is left.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
mkdir -p $XDG_CACHE_HOME/nerva && tar xzf .gpu/kcache.tgz -C $XDG_CACHE_HOME/nerva && mv $XDG_CACHE_HOME/nerva/kcache $XDG_CACHE_HOME/nerva/kernels
M=/tmp/nerva-models; mkdir -p $M
(t=$(date +%s); .gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null; echo "models $(( $(date +%s) - t )) s" >> $O/times.txt) &
t1=$(date +%s)
timeout 400 .gpu/gpu_kernels --tokens "" --mma-tokens "" --gemm-tokens 64,128,192,256,512,2048 --only qwen3-8b > $O/kernels.log 2>&1
echo "kernels rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
grep -il "compil" $O/kernels.log >/dev/null && grep -i "compil\|cache" $O/kernels.log | head -5 >> $O/times.txt
wait
t1=$(date +%s)
timeout 90 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 16 --prefill "" \
  --max-step-tokens 1024 --mixed 64:64,64:128,64:192,64:256,64:512 > $O/mixed.log 2>&1
echo "mixed rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
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
s64() { # name daemon-flags...
  local name=$1; shift
  daemon $name qwen3-8b --max-batch 256 --max-step-tokens 1024 "$@"
  t1=$(date +%s)
  timeout 120 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  kill $pid; wait $pid
}
s64 s64_c512
s64 s64_c256 --prefill-chunk 256
s64 s64_c128 --prefill-chunk 128
s64 s64_fast --fast-prefill
s64 s64_c512b
left=$(( 560 - ($(date +%s) - T0) ))
if [ $left -gt 150 ]; then
  daemon sweep qwen3-8b --max-batch 256 --max-step-tokens 1024
  t1=$(date +%s)
  timeout $(( left - 20 )) .gpu/nervactl --socket $sock bench --streams 1,8,32,128,256 --prompt-tokens 512 \
    --max-tokens 256 --waves 1 --out $O/sweep.json > $O/sweep.log 2>&1
  echo "sweep rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
  kill $pid; wait $pid
fi
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -h "read bandwidth measured" $O/daemon_*.log | cut -c1-120 | head -3
echo "-- kernels"; grep -E "qwen3-8b|peak|TFLOP|^\|" $O/kernels.log | head -40
echo "-- mixed"; grep -E "read bandwidth|^\| |mixed" $O/mixed.log | head -20
for p in qwen3-8b qwen3-0.6b; do echo "-- client $p"; grep -vE "^\s*$" $O/client_$p.log | tail -4; done
for n in s64_c512 s64_c256 s64_c128 s64_fast s64_c512b; do echo "-- $n"; grep -E "^ +64 " $O/$n.log; done
echo "-- sweep"; grep -E "^ +[0-9]+ +[0-9]" $O/sweep.log
