#!/usr/bin/env bash
# Session 31, call 3: where qwen3-8b's batch-1 step goes on the H200. nsys (if present) traces
# the graph's kernels as they run, overlap included; ncu times every kernel of the step alone
# (serialized) with its DRAM bytes. Then the persistent wgt (NERVA_WG_PERSISTENT) against the
# default on the 2,048-token prompt and the 64 + 512 mixed step, three pairs.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
(which nsys; ls /usr/local/cuda/bin | grep -i nsys; ls -d /opt/nvidia/nsight-systems* /usr/local/cuda/nsight-systems* 2>&1) > $O/nsys_where.txt 2>&1
M=/tmp/nerva-models; mkdir -p $M
.gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
timeout 240 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
NSYS=$(which nsys 2>/dev/null || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  t1=$(date +%s)
  timeout 120 $NSYS profile --cuda-graph-trace=node -o $O/trace --force-overwrite true \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 128 --tokens 16 --prefill "" > $O/nsys.log 2>&1
  timeout 60 $NSYS stats --report cuda_gpu_trace --format csv --output $O/trace $O/trace.nsys-rep >> $O/nsys.log 2>&1
  rm -f $O/trace.sqlite
  echo "nsys rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
fi
t1=$(date +%s)
timeout 150 ncu --graph-profiling node --clock-control none --launch-skip 400 --launch-count 400 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 128 --tokens 8 --prefill "" > $O/ncu_step.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
python3 - $O/ncu_step.txt > $O/ncu_step_summary.log <<'PY'
import re, sys, collections
tot = collections.OrderedDict(); name = None; cur = {}
for line in open(sys.argv[1]):
    m = re.match(r"\s\s(\S+) \((\d+), (\d+), (\d+)\)x", line)
    if m: name = m.group(1) + " grid(%s)" % m.group(2); continue
    m = re.search(r"(gpu__time_duration.sum|dram__bytes_read.sum)\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(3).replace(",", ""))
        u = m.group(2)
        v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3,
              "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3}.get(u, 1)
        cur[m.group(1)] = v
        if len(cur) == 2:
            tot.setdefault(name, []).append((cur["gpu__time_duration.sum"], cur["dram__bytes_read.sum"])); cur = {}
print("median us, median MB read, TB/s, count, kernel")
for k, v in tot.items():
    t = sorted(x[0] for x in v); b = sorted(x[1] for x in v)
    tm, bm = t[len(t)//2], b[len(b)//2]
    print(f"{tm:9.2f} us {bm:9.2f} MB {bm/tm if tm else 0:6.2f} TB/s x{len(v):4d}  {k}")
PY
dec() { # name env...
  local name=$1; shift
  local t1=$(date +%s)
  env "$@" timeout 60 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 16 \
    --prefill 2048 --mixed 64:512 --max-step-tokens 2048 > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b c; do
  [ $(( $(date +%s) - T0 )) -lt 480 ] || break
  dec p1_$r NERVA_WG_PERSISTENT=1
  dec p0_$r X=0
done
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt $O/nsys_where.txt
head -c 1500 $O/nsys.log 2>/dev/null
cat $O/ncu_step_summary.log
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| (64|2048) |mixed|rror|panick" $O/dec_$f.log | head -6; done
