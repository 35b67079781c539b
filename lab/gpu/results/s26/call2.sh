#!/usr/bin/env bash
# Session 26, call 2: tail plans + the wgmma prompt-launch cost fit (128-token tiles from 512
# tokens) against HEAD (97559db, the `_base` binaries): the GEMMs per projection (new binary,
# tail off/on), whole steps alternating twice, then issue 8's closed loop at 64 and 32 streams,
# base and new daemons alternating.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
t1=$(date +%s)
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
for p in 0 1; do
  t1=$(date +%s)
  NERVA_MMA_GEMM_TAIL=$p timeout 150 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 512,576,1088 --only qwen3-8b > $O/kernels_t$p.log 2>&1
  echo "kernels_t$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
wait
echo "model $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name binary
  local t1=$(date +%s)
  timeout 120 .gpu/$2 --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 32 \
    --prefill 512,2048 --mixed 64:512,64:1024 --max-step-tokens 2048 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 300 ] || break
  dec new_$r gpu_decode
  dec base_$r gpu_decode_base
done
sw() { # name binary streams
  local name=$1 sock=/tmp/nerva-$1.sock t1=$(date +%s)
  .gpu/$2 --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 > $O/daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 120 .gpu/nervactl --socket $sock bench --streams $3 --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/sweep_$name.log 2>&1
  kill $pid; wait $pid
  echo "sweep_$name $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 500 ] || break
  sw new_$r nervad 64,32
  [ $(( $(date +%s) - T0 )) -lt 540 ] || break
  sw base_$r nervad_base 64,32
done
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for p in 0 1; do echo "-- kernels t$p"; grep -E "qwen3-8b .* (512|576|1088) \||peak" $O/kernels_t$p.log | grep -v GEMV | head -14; done
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -o 'mixed step ~[0-9.]* GPU ms' $O/dec_$f.log | tr '\n' ' ')"; grep -E "^\| [0-9]|panick|rror" $O/dec_$f.log | head -4; done
for f in $(ls $O | grep '^sweep_' | sed 's/sweep_//; s/.log//'); do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -3; done
