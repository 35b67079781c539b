#!/usr/bin/env bash
# Two gpu_decode builds on the same machine, one after the other per model (a change's A/B):
#   lab/gpu/ab_decode.sh BIN_DIR OUT_DIR OLD NEW [models]
# AB_BATCH (default 1,64), AB_PROMPT (the batch rows' prompt, default 128), AB_PREFILL (default
# 512,2048) and AB_STEP (max step tokens, 2048).
set -u
B=$(realpath "$1"); O=$2; old=$3; new=$4; shift 4
mkdir -p "$O"
export NERVA_CUDA_INCLUDE=${NERVA_CUDA_INCLUDE:-/usr/local/cuda/include}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nerva-cache}
M=/tmp/nerva-models
for p in ${*:-qwen3-8b}; do
  [ -f "$M/$p/config.json" ] || "$B/nervad" make-model --preset "$p" --out "$M/$p" --seed 1234 >/dev/null
  for bin in "$old" "$new"; do
    echo "== $p $bin"
    timeout 300 "$B/$bin" --model "$M/$p" --batch "${AB_BATCH:-1,64}" --prompt "${AB_PROMPT:-128}" --prefill "${AB_PREFILL:-512,2048}" \
      --max-step-tokens "${AB_STEP:-2048}" --json 2>&1 | grep -E "^\{|bandwidth|^\| [0-9]|WARN|prefill|panick"
  done
done 2>&1 | tee -a "$O/ab.log"
