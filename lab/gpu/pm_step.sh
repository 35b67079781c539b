#!/usr/bin/env bash
# One decode step's DRAM timeline on the GPU machine: ncu's PM sampling of one whole decode-graph
# replay of gpu_decode (batch 1 unless BATCH is set), its kernels overlapping as in service.
#   lab/gpu/pm_step.sh BIN_DIR MODEL_DIR OUT_PREFIX LO_MS HI_MS
# LO_MS..HI_MS brackets the step's time (e.g. 3 7 for qwen3-8b, 0.6 1.6 for qwen3-0.6b): the
# launches ncu lists first with one single-pass metric are searched for the tenth that long (a
# graph replay), then that one is sampled. Writes OUT_PREFIX.list.txt, .ncu-rep, .txt and .csv;
# read the .csv with lab/gpu/pm_timeline.py.
set -u
bin=$1 model=$2 out=$3 lo=$4 hi=$5
run=("$bin/gpu_decode" --model "$model" --batch "${BATCH:-1}" --prompt 128 --tokens 40 --prefill "")
timeout 150 ncu --graph-profiling graph --metrics gpu__time_duration.sum --launch-count 700 \
  "${run[@]}" > "$out.list.txt" 2>&1
skip=$(python3 - "$out.list.txt" "$lo" "$hi" <<'PY'
import re, sys
lo, hi = float(sys.argv[2]), float(sys.argv[3])
idx, hits = -1, []
for line in open(sys.argv[1]):
    if line.startswith("  ") and not line.startswith("   ") and "Context" in line:
        idx += 1
    m = re.match(r"\s+gpu__time_duration\.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and idx >= 0:
        v = float(m.group(2).replace(",", ""))
        v = {"ms": v, "msecond": v, "us": v / 1e3, "usecond": v / 1e3, "s": v * 1e3}.get(m.group(1), v)
        if lo <= v <= hi:
            hits.append(idx)
print(hits[9] if len(hits) > 9 else -1)
PY
)
if [ "$skip" -lt 0 ]; then
  echo "no launch of $lo-$hi ms among the first 700 (see $out.list.txt)" >&2
  exit 1
fi
timeout 150 ncu --graph-profiling graph --clock-control none --section PmSampling \
  --launch-skip "$skip" --launch-count 1 -o "$out" -f "${run[@]}" > "$out.txt" 2>&1
ncu --import "$out.ncu-rep" --page raw --print-metric-instances values --csv > "$out.csv"
