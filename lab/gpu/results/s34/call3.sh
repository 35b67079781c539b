#!/usr/bin/env bash
# Session 34, call 3, the final source: (a) the norm sums (default, now written only where the
# next norm prologue reads them: 1-2 tokens) against NERVA_NORM_SUMS=0, qwen3-8b batch 1 and 8,
# alternating twice; (b) the bit-identity test and the rest of the GPU suite; (c) issue 7's
# batch-1 decode of qwen3-8b (prompt 128, 256 new tokens) in gpu_decode and through a real
# client (a daemon with its defaults and --max-batch 8, `nervactl bench --streams 1`).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name model env
  local name=$1 model=$2 e=$3
  local t1=$(date +%s)
  env "$e" timeout 45 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  dec 8b_off_$r qwen3-8b NERVA_NORM_SUMS=0
  dec 8b_on_$r qwen3-8b X=0
done
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 200 .gpu/cuda_backend kernel_variants_give_identical_bits --nocapture > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 150 .gpu/cuda_backend --nocapture --test-threads 1 --skip kernel_variants_give_identical_bits > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 60 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prefill "" > $O/bench_qwen3-8b.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
sock=/tmp/nerva-s.sock
t1=$(date +%s)
rm -f $sock
.gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 8 > $O/daemon.log 2>&1 &
pid=$!
for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
echo "daemon up after $(( $(date +%s) - t1 )) s" >> $O/times.txt
left=$(( 585 - ($(date +%s) - T0) ))
timeout $left .gpu/nervactl --socket $sock bench --procs 1 --streams 1 --prompt-tokens 128 \
  --max-tokens 256 --waves 2 --out $O/client.json > $O/client.log 2>&1
echo "client rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
timeout 20 .gpu/nervactl --socket $sock stats > $O/stats.log 2>&1
kill $pid; wait $pid
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked|norm sums" $O/bits.log $O/tests.log | cut -c1-200
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
echo "-- bench"; grep -E "read bandwidth|weights read|^\| [0-9]" $O/bench_qwen3-8b.log
echo "-- client"; grep -vE "^\s*$" $O/client.log | tail -14
