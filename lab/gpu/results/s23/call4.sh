#!/usr/bin/env bash
# Session 23, call 4: the GPU tests call 3 did not reach (its limit ran out while the cold kernel
# cache compiled), on the same kernels; then prompts of 2,016-2,048 tokens, five distinct
# prompts each (call 3's 2,032-token prompt took 5 ms more than its neighbours: length or tokens?).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 330 .gpu/cuda_backend --nocapture --test-threads 1 seeded steady step_reports batch_invariant swapped > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
for step in 1024 2048; do
  [ $(( $(date +%s) - T0 )) -lt 470 ] || break
  t1=$(date +%s)
  timeout 60 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 512,2016,2024,2032,2040,2048 \
    --max-step-tokens $step > $O/prefill_$step.log 2>&1
  echo "prefill_$step rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick" $O/tests.log
for step in 1024 2048; do echo "-- budget $step"; grep -E "^\| [0-9]+ \| [0-9.]+ \| [0-9]+ \| [0-9] \|" $O/prefill_$step.log; done
