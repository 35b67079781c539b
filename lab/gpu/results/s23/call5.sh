#!/usr/bin/env bash
# Session 23, call 5: issue 7's benchmark on the H200 with the final kernels: batch-1 (and 8)
# decode of qwen3-0.6b and qwen3-8b (prompt 128, 256 new tokens, read bandwidth in the same
# process), then the PyTorch peer on the same checkpoints (the 8B's only if time allows).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache PYTHONUNBUFFERED=1
O=$OUT/r5; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
for p in qwen3-0.6b qwen3-8b; do
  [ $p = qwen3-8b ] && wait
  t1=$(date +%s)
  timeout 200 .gpu/gpu_decode --model $M/$p --batch 1,8 --prefill "" > $O/bench_$p.log 2>&1
  echo "bench_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
for p in qwen3-0.6b qwen3-8b; do
  left=$(( 370 - ($(date +%s) - T0) ))
  [ $left -gt 60 ] || break
  t1=$(date +%s)
  timeout $left python3 lab/gpu/torch_peer.py --model $M/$p > $O/peer_$p.log 2>&1
  echo "peer_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for p in qwen3-0.6b qwen3-8b; do echo "-- $p"; grep -E "read bandwidth|weights read|^\| [0-9]" $O/bench_$p.log; grep tok_s $O/peer_$p.log; done
