#!/usr/bin/env bash
# Session 18, call 1: (a) the pair-shape serial attention merging with every partial loaded in
# one round trip (gpu_decode vs gpu_decode_old, alternating, batch 32/64 over 512-token
# prompts, and mixed steps 64:448/512/576 to price the step tile); (b) the GPU bit tests on the
# new kernels; (c) the daemon at 64 and 32 closed-loop streams with --step-tile 128 (default)
# against 0, alternating.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
t0=$(date +%s)
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t0 )) s" >> $O/times.txt
ab() { # tag binary
  local t1=$(date +%s)
  timeout 200 .gpu/$2 --model $M/qwen3-8b --batch 32,64 --prompt 512 --tokens 128 --prefill "" \
    --mixed 64:448,64:512,64:576 --max-step-tokens 1024 --json > $O/ab_$1.log 2>&1
  echo "ab_$1 $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
ab old1 gpu_decode_old
ab new1 gpu_decode
ab old2 gpu_decode_old
ab new2 gpu_decode
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 300 .gpu/cuda_backend --nocapture --test-threads 1 kernel_variants_give_identical_bits tensor_projections_are_batch_invariant > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
sw() { # name streams daemon-flags...
  local name=$1 streams=$2 sock=/tmp/nerva-$1.sock t1=$(date +%s); shift 2
  .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 "$@" \
    > $O/daemon_$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout 150 .gpu/nervactl --socket $sock bench --streams $streams --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/sweep_$name.log 2>&1
  timeout 30 .gpu/nervactl --socket $sock stats > $O/stats_$name.txt 2>&1
  kill $pid; wait $pid
  echo "$name $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
sw tile0_a 32,64 --step-tile 0
sw tile_a 32,64
sw tile0_b 64 --step-tile 0
sw tile_b 64
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/times.txt
for f in old1 new1 old2 new2; do echo "-- $f"; grep -E "bandwidth|^\| |mixed|panick|rror" $O/ab_$f.log | head -14; done
grep -E "test |test result" $O/bits.log
for f in tile0_a tile_a tile0_b tile_b; do echo "-- $f"; grep -E 'nervactl bench: [0-9]+ streams|rror' $O/sweep_$f.log | head -4; done
