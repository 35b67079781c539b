#!/usr/bin/env bash
# Session 32, call 3 (the persistent one-n-tile projections now on by default): every GPU test
# (`NERVA_GPU_BIG=1 cuda_backend --test-threads 1`); then issue 7's benchmark: batch-1 (and 8)
# decode of qwen3-0.6b and qwen3-8b (prompt 128, 256 new tokens, read bandwidth in the same
# process) and the PyTorch peer on the same checkpoints.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache PYTHONUNBUFFERED=1
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 430 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
for p in qwen3-0.6b qwen3-8b; do
  t1=$(date +%s)
  timeout 60 .gpu/gpu_decode --model $M/$p --batch 1,8 --prefill "" > $O/bench_$p.log 2>&1
  echo "bench_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
for p in qwen3-0.6b qwen3-8b; do
  left=$(( 575 - ($(date +%s) - T0) ))
  [ $left -gt 50 ] || break
  t1=$(date +%s)
  timeout $left python3 lab/gpu/torch_peer.py --model $M/$p > $O/peer_$p.log 2>&1
  echo "peer_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked" $O/tests.log | cut -c1-200
grep -cE "bit-identical" $O/tests.log
for p in qwen3-0.6b qwen3-8b; do echo "-- $p"; grep -E "read bandwidth|weights read|^\| [0-9]" $O/bench_$p.log; grep tok_s $O/peer_$p.log; done
