#!/usr/bin/env bash
# Session 29, call 3: issue 7's benchmark on the final kernels (the deep weight ring below one
# wave by default): batch-1 (and 8) decode of qwen3-0.6b and qwen3-8b (prompt 128, 256 new
# tokens, read bandwidth in the same process), the PyTorch peer on the same checkpoints, then
# gpu_kernels' read test (1.25 GiB) and the 8B's down projection at one token.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache PYTHONUNBUFFERED=1
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
for p in qwen3-0.6b qwen3-8b; do
  [ $p = qwen3-8b ] && wait
  t1=$(date +%s)
  timeout 240 .gpu/gpu_decode --model $M/$p --batch 1,8 --prefill "" > $O/bench_$p.log 2>&1
  echo "bench_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
for p in qwen3-0.6b qwen3-8b; do
  left=$(( 440 - ($(date +%s) - T0) ))
  [ $left -gt 60 ] || break
  t1=$(date +%s)
  timeout $left python3 lab/gpu/torch_peer.py --model $M/$p > $O/peer_$p.log 2>&1
  echo "peer_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
if [ $(( $(date +%s) - T0 )) -lt 480 ]; then
  timeout 60 stdbuf -oL .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only qwen3-8b/down > $O/kernels_down.log 2>&1
  echo "kernels rc=$?" >> $O/times.txt
fi
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for p in qwen3-0.6b qwen3-8b; do echo "-- $p"; grep -E "read bandwidth|weights read|^\| [0-9]" $O/bench_$p.log; grep tok_s $O/peer_$p.log; done
grep -E "read bandwidth|qwen3-8b" $O/kernels_down.log
