#!/usr/bin/env bash
# Session 19, call 6: the final source: the invariant default against the fastest mode
# (gpu_decode --projections tensor | mixed: batch 1 and 64, a 2,048-token prompt), the bf16 GEMM
# peak in the same machine, then issue 8's load (1/8/32/64 streams, then 128/256 and the
# 32-sample fork in a second daemon).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r6; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
for p in tensor mixed; do
  t1=$(date +%s)
  timeout 200 .gpu/gpu_decode --model $M/qwen3-8b --projections $p --batch 1,64 --prompt 512 --tokens 64 \
    --prefill 2048 --max-step-tokens 2048 > $O/modes_$p.log 2>&1
  echo "modes_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
timeout 100 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak.log 2>&1
sw() { # name streams fork
  local name=$1 streams=$2 fork=$3 sock=/tmp/nerva-$1.sock t1=$(date +%s)
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 \
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
sw low 1,8,32,64 0
sw high 128,256 1
tar czf $OUT/r6.tgz -C $OUT r6
echo "===== summary"
cat $O/times.txt
for p in tensor mixed; do echo "-- $p"; grep -E "^\| [0-9]|rror|panick" $O/modes_$p.log | head -6; done
grep -E "peak|rror" $O/peak.log
for f in low high; do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -6; done
grep -E "fork|sequential|at once|×" $O/fork_high.log | head -8
