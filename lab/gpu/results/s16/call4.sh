#!/usr/bin/env bash
# Session 14, call 4: wg64s only where it evens out the waves (gate|up, q|k|v at 64 tokens): whole steps.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name --format=csv | tee $O/r4_gpu.txt
which nsys; ls /usr/local/cuda/bin | grep -i nsys; ls /opt/nvidia 2>/dev/null
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
for i in 1 2; do for s in 0 1; do
  echo "== gpu_decode NERVA_WG_STREAM=$s run $i"
  NERVA_WG_STREAM=$s timeout 300 .gpu/gpu_decode --model $M/qwen3-8b --batch 32,48,64 --prompt 512 --prefill "" --max-step-tokens 2048 --json 2>&1 | grep -E "^\| [0-9]|bandwidth|panick" | tee -a $O/r4_ab_$s.log
done; done
echo "===== summary"; for s in 0 1; do echo "-- stream=$s"; grep -E '^\| [0-9]' $O/r4_ab_$s.log | cut -c1-80; done
