#!/usr/bin/env bash
# Attention under ncu on qwen3-8b: one 2,048-token prompt's attn_prefill, and batch-64 decode
# attention over 512-token prompts, with the main sections. NCU_PARTS="prefill decode" (default).
#   lab/gpu/ncu_attention.sh BIN_DIR OUT_DIR
set -u
B=$(realpath "$1"); O=$2
mkdir -p "$O"
export NERVA_CUDA_INCLUDE=${NERVA_CUDA_INCLUDE:-/usr/local/cuda/include}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nerva-cache}
M=/tmp/nerva-models; p=qwen3-8b
[ -f "$M/$p/config.json" ] || "$B/nervad" make-model --preset $p --out "$M/$p" --seed 1234 >/dev/null
parts=${NCU_PARTS:-prefill decode}
# The 128-token prompt of the decode table runs 36 attn_prefill launches first.
[[ " $parts " == *" prefill "* ]] && timeout 200 ncu --graph-profiling node -k "regex:attn_prefill" --launch-skip ${NCU_SKIP:-40} --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section LaunchStats \
  "$B/gpu_decode" --model $M/$p --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 2048 > "$O/ncu_attn_prefill.txt" 2>&1
[[ " $parts " == *" prefill "* ]] && grep -vE "^==PROF==|^\s*$|----" "$O/ncu_attn_prefill.txt" | grep -A200 "attn_prefill" | head -120
[[ " $parts " == *" decode "* ]] || exit 0
# Decode attention at batch 64 over 512-token prompts (context 512-576): attn_decode* only (the
# prompts run attn_prefill), past the warm-up steps.
timeout 200 ncu --graph-profiling node -k "regex:attn_decode" --launch-skip ${NCU_DECODE_SKIP:-400} --launch-count 6 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
  "$B/gpu_decode" --model $M/$p --batch 64 --prompt 512 --tokens 24 --prefill "" > "$O/ncu_attn_decode.txt" 2>&1
grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy" "$O/ncu_attn_decode.txt" | head -40
