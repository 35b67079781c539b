#!/usr/bin/env bash
# Session 14, call 6: why wg64s's per-launch gain does not reach whole steps: clocks/power while
# decoding, and ncu without the cache flush. NERVA_WG_STREAM=1 forces the rule-selected launches.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv | tee $O/r6_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
for s in 0 1 0 1; do
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 50 > $O/r6_smi_$s.txt &
  sp=$!
  NERVA_WG_STREAM=$s timeout 300 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 512 --prefill "" --max-step-tokens 2048 2>&1 | grep -E "^\| [0-9]"
  kill $sp
  echo "== stream=$s smi (sm clock MHz, power W, throttle) over the run's second half:"
  n=$(wc -l < $O/r6_smi_$s.txt); tail -n $((n/2)) $O/r6_smi_$s.txt | python3 -c "
import sys,collections
c=[];p=[];t=collections.Counter()
for l in sys.stdin:
    f=[x.strip() for x in l.split(',')]
    try: c.append(float(f[0].split()[0])); p.append(float(f[2].split()[0])); t[f[4]]+=1
    except Exception: pass
c.sort(); p.sort()
print('sm clock p10/p50/p90', c[len(c)//10], c[len(c)//2], c[9*len(c)//10], ' power p50/p90', p[len(p)//2], p[9*len(p)//10], dict(t.most_common(3)))"
done
for s in 0 1; do
  NERVA_WG_STREAM=$s timeout 280 ncu --cache-control none --clock-control none --graph-profiling node --launch-skip 11000 --launch-count 420 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 64 --prefill "" --max-step-tokens 2048 > $O/r6_ncu_step_$s.txt 2>&1
  echo "== ncu no flush, stream=$s"; python3 .gpu/ncu_sum.py $O/r6_ncu_step_$s.txt | head -5 | tee $O/r6_ncu_step_${s}_summary.log
done
