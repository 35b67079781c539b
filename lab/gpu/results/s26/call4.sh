#!/usr/bin/env bash
# Session 26, call 4, the final source (5c0694d): every GPU test, the GEMM peak, issue 8's load
# on the daemon's defaults (1/8/32/64 streams, then 128/256 and the 32-sample fork in a second
# daemon), then the invariant default against the fastest mode.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 320 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak.log 2>&1
sw() { # name streams fork
  local name=$1 streams=$2 fork=$3 sock=/tmp/nerva-$1.sock t1=$(date +%s)
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 \
    > $O/daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 170 .gpu/nervactl --socket $sock bench --streams $streams --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/sweep_$name.log 2>&1
  timeout 30 .gpu/nervactl --socket $sock stats > $O/stats_$name.txt 2>&1
  [ $fork = 1 ] && timeout 60 .gpu/nervactl --socket $sock bench --fork 32 --prompt-tokens 512 \
    --max-tokens 128 --out $O/fork_$name.json > $O/fork_$name.log 2>&1
  kill $pid; wait $pid
  echo "$name $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
[ $(( $(date +%s) - T0 )) -lt 390 ] && sw low 1,8,32,64 0
[ $(( $(date +%s) - T0 )) -lt 430 ] && sw high 128,256 1
for p in tensor mixed; do
  [ $(( $(date +%s) - T0 )) -lt 490 ] || break
  t1=$(date +%s)
  timeout 40 .gpu/gpu_decode --model $M/qwen3-8b --projections $p --batch 1,64 --prompt 512 --tokens 64 \
    --prefill 2048 --max-step-tokens 2048 > $O/modes_$p.log 2>&1
  echo "modes_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result" $O/tests.log
grep -E "peak|rror" $O/peak.log
for f in low high; do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -6; done
grep -E "fork|sequential|at once|×" $O/fork_high.log | head -8
for p in tensor mixed; do echo "-- $p"; grep -E "^\| [0-9]|rror|panick" $O/modes_$p.log | head -6; done
