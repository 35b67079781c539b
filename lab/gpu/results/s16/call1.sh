#!/usr/bin/env bash
# Session 14, call 1: serial-block-shapes (becbed8) — GPU tests, A/B vs main (1489310), ncu step shares.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/r1_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
( time NERVA_GPU_BIG=1 .gpu/cuda_backend --nocapture --test-threads 1 ) > $O/r1_tests.log 2>&1
grep -E '^test |test result|real' $O/r1_tests.log
for i in 1 2; do
AB_BATCH=8,16,32,64 AB_PROMPT=512 AB_PREFILL=512 lab/gpu/ab_decode.sh .gpu $O/ab$i gpu_decode_base gpu_decode qwen3-8b > /dev/null 2>&1
cp $O/ab$i/ab.log $O/r1_ab$i.log
done
NCU_STEP_BATCH=64 bash lab/gpu/run_cuda.sh .gpu $O/step ncu-step > $O/r1_ncu_step_console.log 2>&1
cp $O/step/ncu_step_summary.log $O/r1_ncu_step_summary.log 2>/dev/null
echo "===== summary"
for i in 1 2; do echo "-- A/B run $i"; grep -E '^== |^\| [0-9]' $O/r1_ab$i.log | cut -c1-110; done
echo "-- ncu step (new)"; head -40 $O/r1_ncu_step_summary.log
