#!/usr/bin/env bash
# Session 37, call 2: the final figures. Every GPU test (the bit-identity test included) under
# the chosen launch-shape threshold (FIT, the new default), in the background while the models
# are made; issue 7's batch-1 benchmark (gpu_decode, then a daemon and `nervactl bench` through a
# real client) and, in the same run, the PyTorch peer on the same checkpoints.
set -u
FIT=${FIT:-512}
export NERVA_MMA_GEMM_PROMPT_FIT=$FIT
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
echo "NERVA_MMA_GEMM_PROMPT_FIT=$FIT" >> $O/times.txt
[ -d $XDG_CACHE_HOME/nerva/kernels ] || { mkdir -p $XDG_CACHE_HOME/nerva && tar xzf .gpu/kcache.tgz -C $XDG_CACHE_HOME/nerva && mv $XDG_CACHE_HOME/nerva/kcache $XDG_CACHE_HOME/nerva/kernels; }
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 300 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1 &
tests=$!
M=/tmp/nerva-models; mkdir -p $M
for p in qwen3-0.6b qwen3-8b; do
  [ -f $M/$p/config.json ] || .gpu/nervad make-model --preset $p --out $M/$p --seed 1234 >/dev/null
done
wait $tests
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
for p in qwen3-8b qwen3-0.6b; do
  t1=$(date +%s)
  timeout 60 .gpu/gpu_decode --model $M/$p --batch 1 --prefill "" > $O/bench_$p.log 2>&1
  echo "bench_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
sock=/tmp/nerva-s.sock
for p in qwen3-8b qwen3-0.6b; do
  t1=$(date +%s)
  rm -f $sock
  .gpu/nervad --model $M/$p --socket $sock --backend cuda --max-batch 8 > $O/daemon_$p.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
  timeout 90 .gpu/nervactl --socket $sock bench --procs 1 --streams 1 --prompt-tokens 128 \
    --max-tokens 256 --waves 2 --out $O/client_$p.json > $O/client_$p.log 2>&1
  echo "client_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  kill $pid; wait $pid
done
for p in qwen3-0.6b qwen3-8b; do
  left=$(( 570 - ($(date +%s) - T0) ))
  [ $left -gt 40 ] || break
  t1=$(date +%s)
  timeout $left python3 lab/gpu/torch_peer.py --model $M/$p > $O/peer_$p.log 2>&1
  echo "peer_$p rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked" $O/tests.log | cut -c1-160
for p in qwen3-8b qwen3-0.6b; do echo "-- $p"; grep -E "read bandwidth|weights read|^\| [0-9]" $O/bench_$p.log; grep -E "^ +1 " $O/client_$p.log; grep tok_s $O/peer_$p.log; done
