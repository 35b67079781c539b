#!/usr/bin/env bash
# Session 30, call 2 (the rope epilogue in batches of 4 units, each warp's positions and pages
# looked up a lane per unit first): the bit-identity test's q|k|v variants on every preset, the
# big ones included; the GEMM peak; then qwen3-8b prompts of 512, 1,024 and 2,048 tokens, batch
# 64 and a mixed step, the same binary with NERVA_ROPE_EPILOGUE=1 / 0 alternating three times.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 NERVA_GPU_VARIANTS='q|k|v' timeout 320 .gpu/cuda_backend kernel_variants_give_identical_bits \
  --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
timeout 90 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/qkv > $O/kernels.log 2>&1
dec() { # name env...
  local name=$1; shift
  local t1=$(date +%s)
  env "$@" timeout 90 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 16 \
    --prefill 512,1024,2048 --mixed 64:512 --max-step-tokens 2048 > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b c; do
  for c in on:NERVA_ROPE_EPILOGUE=1 off:NERVA_ROPE_EPILOGUE=0; do
    [ $(( $(date +%s) - T0 )) -lt 540 ] || break 2
    dec ${c%%:*}_$r ${c#*:}
  done
done
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|differ|panicked" $O/tests.log | head -20
grep -E "qkv  .* 2048|peak" $O/kernels.log
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| [0-9]|mixed|bandwidth|rror|panick" $O/dec_$f.log | head -12; done
