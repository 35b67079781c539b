#!/usr/bin/env bash
# Session 36, call 2: `--projections blas` (new: cuBLAS for every projection launch of 16 tokens
# or more, decode batches included; not batch-invariant) against the invariant default:
# gpu_decode at batch 16-64 and a mixed step, alternating; issue 8's 64 streams alternating;
# the GPU tests of the cuBLAS paths (the blas mode's new parity test, the fast prefill's); the
# blas sweep where time is left.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
mkdir -p $XDG_CACHE_HOME/nerva && tar xzf .gpu/kcache.tgz -C $XDG_CACHE_HOME/nerva && mv $XDG_CACHE_HOME/nerva/kcache $XDG_CACHE_HOME/nerva/kernels
M=/tmp/nerva-models; mkdir -p $M
t=$(date +%s); .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t )) s" >> $O/times.txt
dec() { # name projections
  local t1=$(date +%s)
  timeout 90 .gpu/gpu_decode --model $M/qwen3-8b --batch 16,32,64 --prompt 512 --tokens 16 --prefill "" \
    --max-step-tokens 1024 --mixed 64:512 --projections $2 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec tensor_a tensor; dec blas_a blas; dec tensor_b tensor; dec blas_b blas
sock=/tmp/nerva-s.sock
daemon() { # name flags...
  local name=$1; shift
  local t1=$(date +%s)
  rm -f $sock
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 "$@" > $O/daemon_$name.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
  echo "daemon_$name up after $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
s64() { # name flags...
  local name=$1; shift
  daemon $name "$@"
  t1=$(date +%s)
  timeout 120 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  kill $pid; wait $pid
}
s64 s64_tensor_a; s64 s64_blas_a --projections blas; s64 s64_tensor_b; s64 s64_blas_b --projections blas
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 150 .gpu/cuda_backend --nocapture --test-threads 1 blas_projections prefill_and_fused_decode > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
left=$(( 540 - ($(date +%s) - T0) ))
if [ $left -gt 120 ]; then
  daemon sweep_blas --projections blas
  t1=$(date +%s)
  timeout $(( left - 25 )) .gpu/nervactl --socket $sock bench --streams 1,8,32,128,256 --prompt-tokens 512 \
    --max-tokens 256 --waves 1 --out $O/sweep_blas.json > $O/sweep_blas.log 2>&1
  echo "sweep_blas rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
  kill $pid; wait $pid
fi
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -h "read bandwidth measured" $O/daemon_*.log | cut -c1-120 | head -2
grep -E "^test |test result|panicked|blas projections" $O/tests.log | cut -c1-200
for n in tensor_a blas_a tensor_b blas_b; do echo "-- dec $n"; grep -E "^\| [0-9]|mixed steps" $O/dec_$n.log; done
for n in s64_tensor_a s64_blas_a s64_tensor_b s64_blas_b; do echo "-- $n"; grep -E "^ +64 " $O/$n.log; done
echo "-- sweep blas"; grep -E "^ +[0-9]+ +[0-9]" $O/sweep_blas.log
