#!/usr/bin/env bash
# Session 37, call 4: the warp-specialized GEMM's half tiles (kernels/mma.cuh WG_HALF_TILE: a
# 128-token tile holding at most 64 tokens runs on n64 wgmma). .gpu/old.tgz holds a55ed8a's
# nervad and gpu_decode (A), .gpu/bins.tgz this source's binaries (B); one kernel cache holds both
# sources' modules. The two GPU tests of the projections' bits (B) while the model is made;
# gpu_kernels at the sizes with a half tile (B); a mixed step of 64 decoders and a 512-token chunk
# and 64 streams, A and B alternating.
set -u
export NERVA_MMA_GEMM_PROMPT_FIT=192 NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
tar xzf .gpu/bins.tgz -C .gpu && tar xzf .gpu/old.tgz -C .gpu
rm -rf $XDG_CACHE_HOME/nerva/kernels; mkdir -p $XDG_CACHE_HOME/nerva && tar xzf .gpu/kcache.tgz -C $XDG_CACHE_HOME/nerva && mv $XDG_CACHE_HOME/nerva/kcache $XDG_CACHE_HOME/nerva/kernels
M=/tmp/nerva-models; mkdir -p $M
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 200 .gpu/cuda_backend --nocapture --test-threads 1 kernel_variants_give_identical_bits tensor_projections_are_batch_invariant > $O/tests.log 2>&1 &
tests=$!
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
wait $tests
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
grep -E "^test |test result|panicked" $O/tests.log | cut -c1-220
t1=$(date +%s)
timeout 60 .gpu/gpu_kernels --tokens "" --mma-tokens "" --gemm-tokens 320,576,640,1088 --only qwen3-8b > $O/kernels.log 2>&1
echo "kernels rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
grep -E "^qwen3-8b" $O/kernels.log | awk -F'|' '{print $1 "|" $6 "|" $8 "|" $9 "|" $11}'
dec() { # name bin
  local t1=$(date +%s)
  timeout 60 $2 --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 16 --prefill "" \
    --max-step-tokens 1024 --mixed 64:512,64:256 > $O/mixed_$1.log 2>&1
  echo "mixed_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  echo "-- mixed $1"; grep -E "mixed steps" $O/mixed_$1.log | sed 's/mixed steps: //'
}
dec a .gpu/old/gpu_decode; dec b .gpu/gpu_decode
sock=/tmp/nerva-s.sock
s64() { # name bin
  local name=$1 t1=$(date +%s)
  rm -f $sock
  $2 --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 > $O/daemon_$name.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
  echo "daemon_$name up after $(( $(date +%s) - t1 )) s" >> $O/times.txt
  t1=$(date +%s)
  timeout 60 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  kill $pid; wait $pid
  echo "-- $name $(( $(date +%s) - T0 )) s"; grep -E "^ +64 " $O/$name.log
}
s64 s64_a1 .gpu/old/nervad; s64 s64_b1 .gpu/nervad
[ $(( $(date +%s) - T0 )) -lt 230 ] && { s64 s64_a2 .gpu/old/nervad; s64 s64_b2 .gpu/nervad; }
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
