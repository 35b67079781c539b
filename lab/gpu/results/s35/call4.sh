#!/usr/bin/env bash
# Session 35, call 4: attn_decode_serial's split partials kept in its shared memory for its own
# merge (new: NERVA_ATTN_SERIAL_PARTS unset, `sm`) against global memory (=0, `gl`, the previous
# path), the same binary and kernels: qwen3-8b decode steps at batch 8, 32, 64 over 512-token
# prompts, alternating twice; then the bit-identity test and the rest of the GPU suite.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name env
  local name=$1 e=$2
  local t1=$(date +%s)
  env "$e" timeout 60 .gpu/gpu_decode --model $M/qwen3-8b --prefill "" --batch 8,32,64 \
    --prompt 512 --tokens 16 > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  dec sm_$r X=0
  dec gl_$r NERVA_ATTN_SERIAL_PARTS=0
done
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 200 .gpu/cuda_backend kernel_variants_give_identical_bits --nocapture > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t1=$(date +%s)
left=$(( 560 - (t1 - T0) ))
NERVA_GPU_BIG=1 timeout $left .gpu/cuda_backend --nocapture --test-threads 1 --skip kernel_variants_give_identical_bits > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s (limit $left)" >> $O/times.txt
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panicked|differ" $O/bits.log $O/tests.log | cut -c1-200 | head -20
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| [0-9]+ \||rror|WARN|panick" $O/dec_$f.log; done
