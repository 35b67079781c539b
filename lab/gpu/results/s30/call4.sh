#!/usr/bin/env bash
# Session 30, call 4: where the rope epilogue's time goes. ncu at the card's own clocks times the
# q|k|v GEMM (`wgt`, or `mma_rope_*_wgt` with the epilogue) and rope_append of lone qwen3-8b
# prompts of 576 tokens (the mixed step's size: 132 whole tiles + 108 in 4 chain splits) and
# 2,048, each mode in its own process; then, time left, whole prompts and the mixed step with the
# persistent wgt (its producer stages the next tile during a tile's epilogue) and the epilogue
# on/off.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r4; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
# Compile the kernels once (the cache serves the ncu runs).
timeout 200 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 8 --tokens 2 --prefill "" > $O/warm.log 2>&1
echo "warm rc=$? $(( $(date +%s) - T0 )) s" >> $O/times.txt
for n in 576 2048; do
  for r in 0 1; do
    t1=$(date +%s)
    NERVA_ROPE_EPILOGUE=$r timeout 90 ncu --graph-profiling node --clock-control none \
      -k "regex:mma_(rms|rope)_bf16_wgt|rope_append" --launch-count 180 \
      --metrics gpu__time_duration.sum \
      .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 8 --tokens 2 --prefill $n \
      --max-step-tokens 2048 > $O/ncu_${n}_r$r.txt 2>&1
    echo "ncu_${n}_r$r rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
    python3 - $O/ncu_${n}_r$r.txt > $O/ncu_${n}_r${r}_summary.log <<'PY'
import re, sys, collections
tot = collections.OrderedDict(); name = None
for line in open(sys.argv[1]):
    m = re.match(r"\s\s(\S+) \((\d+), (\d+), (\d+)\)x", line)
    if m: name = m.group(1) + " grid(%s,%s,%s)" % m.groups()[1:]; continue
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(2).replace(",", "")); v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3}.get(m.group(1), 1)
        tot.setdefault(name, []).append(v); name = None
for k, v in tot.items():
    v = sorted(v)
    print(f"median {v[len(v)//2]:8.1f} us  min {v[0]:8.1f}  x{len(v)}  {k}")
PY
  done
done
dec() { # name env...
  local name=$1; shift
  local t1=$(date +%s)
  env "$@" timeout 60 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 16 \
    --prefill 2048 --mixed 64:512 --max-step-tokens 2048 > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for c in p1r1:NERVA_WG_PERSISTENT=1,NERVA_ROPE_EPILOGUE=1 p1r0:NERVA_WG_PERSISTENT=1,NERVA_ROPE_EPILOGUE=0 \
         p0r0:NERVA_ROPE_EPILOGUE=0 p0r1:NERVA_ROPE_EPILOGUE=1; do
  [ $(( $(date +%s) - T0 )) -lt 470 ] || break
  dec ${c%%:*} $(echo ${c#*:} | tr , ' ')
done
tar czf $OUT/r4.tgz -C $OUT r4
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for f in $O/ncu_*_summary.log; do echo "-- $(basename $f)"; cat $f; done
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| (64|2048) |mixed|rror|panick" $O/dec_$f.log | head -6; done
