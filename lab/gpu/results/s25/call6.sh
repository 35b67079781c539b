#!/usr/bin/env bash
# Session 25, call 6 (H100): why the persistent prompt GEMM is slower on whole prompts. The same
# binary (ce962b8) with NERVA_WG_PERSISTENT=0 and 1, alternating twice, each timing three
# distinct prompts of 2,040-2,048 tokens (six runs each) while nvidia-smi samples power and the
# SM clock every 20 ms; the summary averages the samples drawn while a prompt runs (> 500 W).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r6; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
t1=$(date +%s)
timeout 200 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 128 --tokens 4 --prefill 512 > $O/warm.log 2>&1
echo "warm rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
for r in a b; do
  for p in 0 1; do
    t1=$(date +%s)
    nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader,nounits -lms 20 > $O/smi_p${p}_$r.csv &
    smi=$!
    NERVA_WG_PERSISTENT=$p timeout 100 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 128 --tokens 4 \
      --prefill 2040,2044,2048 --max-step-tokens 2048 > $O/dec_p${p}_$r.log 2>&1
    echo "dec_p${p}_$r rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
    kill $smi; wait $smi 2>/dev/null
  done
done
tar czf $OUT/r6.tgz -C $OUT r6
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for r in a b; do for p in 0 1; do
  echo "-- persistent=$p run $r: $(grep -E '^\| 20[0-9][0-9] ' $O/dec_p${p}_$r.log | awk -F'|' '{printf "%s:%s ms  ", $2, $3}')"
  python3 - $O/smi_p${p}_$r.csv <<'PY'
import sys
rows=[l.split(',') for l in open(sys.argv[1]) if l.count(',')==2]
v=[(float(a),float(b)) for _,a,b in rows if a.strip() and float(a)>500]
if v: print(f"   samples > 500 W: {len(v)}, mean {sum(p for p,_ in v)/len(v):.0f} W, SM clock mean {sum(c for _,c in v)/len(v):.0f} MHz, min {min(c for _,c in v):.0f}")
PY
done; done
