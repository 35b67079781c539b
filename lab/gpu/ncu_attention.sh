#!/usr/bin/env bash
# Attention under ncu on qwen3-8b: one 2,048-token prompt's attn_prefill with the full sections,
# and the per-kernel times of batch-64 decode steps (context 128 + 200).
#   lab/gpu/ncu_attention.sh BIN_DIR OUT_DIR
set -u
B=$(realpath "$1"); O=$2
mkdir -p "$O"
export NERVA_CUDA_INCLUDE=${NERVA_CUDA_INCLUDE:-/usr/local/cuda/include}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nerva-cache}
M=/tmp/nerva-models; p=qwen3-8b
[ -f "$M/$p/config.json" ] || "$B/nervad" make-model --preset $p --out "$M/$p" --seed 1234 >/dev/null
# The 128-token prompt of the decode table runs 36 attn_prefill launches first.
timeout 200 ncu --graph-profiling node -k "regex:attn_prefill" --launch-skip ${NCU_SKIP:-40} --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section LaunchStats \
  "$B/gpu_decode" --model $M/$p --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 2048 > "$O/ncu_attn_prefill.txt" 2>&1
grep -vE "^==PROF==|^\s*$|----" "$O/ncu_attn_prefill.txt" | grep -A200 "attn_prefill" | head -120
# Decode at batch 64 after the prompts (64 × 128 tokens in 256-token steps: 32 steps × 36 layers
# × 6 matching launches before decode).
timeout 200 ncu --graph-profiling node -k "regex:attn_|_wg|mma_|gemv_" --launch-skip 7200 --launch-count 30 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  "$B/gpu_decode" --model $M/$p --batch 64 --tokens 40 --prefill "" > "$O/ncu_b64.txt" 2>&1
grep -E "^  [a-z_0-9]+ \(|gpu__time_duration|dram__bytes_read" "$O/ncu_b64.txt" | paste - - - | awk '{print $1, $2, $3, $4, $(NF-3), $(NF)}' | head -32
