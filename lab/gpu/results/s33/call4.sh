#!/usr/bin/env bash
# Session 33, call 4: DRAM read throughput through one whole decode step, sampled every ~1.5 us
# by ncu's PM sampling (--graph-profiling graph: the decode graph as one workload, its kernels
# overlapping as they do in service), qwen3-8b and qwen3-0.6b batch 1. First each run lists its
# launches with one single-pass metric (which one is a decode graph replay), then profiles the
# tenth graph replay with the PmSampling section and exports every sample.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
for m in qwen3-8b:3.0:7.0 qwen3-0.6b:0.6:1.6; do
  model=${m%%:*}; rest=${m#*:}; lo=${rest%%:*}; hi=${rest#*:}
  t1=$(date +%s)
  timeout 150 ncu --graph-profiling graph --metrics gpu__time_duration.sum --launch-count 700 \
    .gpu/gpu_decode --model $M/$model --batch 1 --prompt 128 --tokens 40 --prefill "" > $O/list_$model.txt 2>&1
  echo "list $model rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  skip=$(python3 - $O/list_$model.txt $lo $hi <<'PY'
import re, sys
lo, hi = float(sys.argv[2]), float(sys.argv[3])
idx, hits = -1, []
for line in open(sys.argv[1]):
    if line.startswith("  ") and not line.startswith("   ") and "Context" in line:
        idx += 1
    m = re.match(r"\s+gpu__time_duration\.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and idx >= 0:
        v = float(m.group(2).replace(",", ""))
        v = {"ms": v, "us": v / 1e3, "usecond": v / 1e3, "msecond": v, "s": v * 1e3}.get(m.group(1), v)
        if lo <= v <= hi:
            hits.append(idx)
print(hits[9] if len(hits) > 9 else -1)
PY
)
  echo "$model skip=$skip" >> $O/times.txt
  [ "$skip" -ge 0 ] || continue
  t1=$(date +%s)
  timeout 150 ncu --graph-profiling graph --clock-control none --section PmSampling \
    --launch-skip $skip --launch-count 1 -o $O/pm_$model \
    .gpu/gpu_decode --model $M/$model --batch 1 --prompt 128 --tokens 40 --prefill "" > $O/pm_$model.txt 2>&1
  echo "pm $model rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  timeout 60 ncu --import $O/pm_$model.ncu-rep --page raw --print-metric-instances values --csv > $O/pm_$model.csv 2>&1
done
ls -la $O > $O/ls.txt
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for model in qwen3-8b qwen3-0.6b; do grep -E "^  [^ ].*Context|gpu__time_duration" $O/list_$model.txt | head -6; grep -c "Context" $O/list_$model.txt; python3 -c "
import csv,sys
rows=list(csv.reader(open('$O/pm_$model.csv')))
print(len(rows), [r[4] for r in rows[2:]])
for r in rows[2:]:
  for i,h in enumerate(rows[0]):
    if 'dramc__read_throughput' in h or 'gpu__time_duration.sum' in h: print(h, r[i][:300])
" 2>&1 | head -8; done
