#!/usr/bin/env bash
# Session 30, call 5 (the last 243 s of device time): the persistent wgt (NERVA_WG_PERSISTENT),
# seen faster once in call 4, A/B on the same binary: qwen3-8b's 2,048-token prompt and the
# 64 decode + 512-token mixed step, on/off alternating. The kernels compile in gpu_kernels while
# the checkpoint is generated, so each gpu_decode process finds them cached.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r5; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
timeout 150 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/kernels.log 2>&1
echo "kernels rc=$? $(( $(date +%s) - T0 )) s" >> $O/times.txt
wait
for c in p1_a:1 p0_a:0 p1_b:1 p0_b:0 p1_c:1 p0_c:0; do
  t1=$(date +%s)
  NERVA_WG_PERSISTENT=${c#*:} timeout 40 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 \
    --tokens 8 --prefill 2048 --mixed 64:512 --max-step-tokens 2048 > $O/dec_${c%%:*}.log 2>&1
  echo "dec_${c%%:*} rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  grep -E "mixed step|^\| 2048 " $O/dec_${c%%:*}.log | sed "s/^/${c%%:*} /"
done
