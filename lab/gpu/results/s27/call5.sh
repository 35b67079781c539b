#!/usr/bin/env bash
# Session 27, call 5, the final source (the wgmma fold with cp.async staging as in call 3, and the proxy fence before the tensor cores read staged data): every GPU test; the
# prompt attention per launch (ncu, card clocks) at 512 and 2,048 tokens, mma.sync fold (w0) vs
# wgmma fold (w1); whole prompts and a mixed step alternating w0/w1 twice; the GEMM peak.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r5; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 380 .gpu/cuda_backend --nocapture --test-threads 1 > $O/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
for n in 2048 512; do for w in 0 1; do
  t1=$(date +%s)
  NERVA_ATTN_WGMMA=$w timeout 60 ncu --graph-profiling node --clock-control none -k "regex:attn_prefill" \
    --launch-skip 36 --launch-count 4 --metrics gpu__time_duration.sum,sm__inst_executed.sum \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill $n --max-step-tokens 2048 > $O/ncu_${n}_w$w.txt 2>&1
  echo "ncu_${n}_w$w rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
done; done
timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak.log 2>&1
dec() { # name wgmma
  local t1=$(date +%s)
  NERVA_ATTN_WGMMA=$2 timeout 60 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 128 --tokens 16 \
    --prefill 2048,1024,512 --mixed 64:512 --max-step-tokens 2048 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 520 ] || break
  dec w0_$r 0
  dec w1_$r 1
done
tar czf $OUT/r5.tgz -C $OUT r5
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result" $O/tests.log
grep -E "peak|rror" $O/peak.log
for f in $(ls $O | grep '^ncu_'); do echo "-- $f $(grep -E 'gpu__time' $O/$f | awk '{print $NF}' | tr '\n' ' ') inst $(grep -E 'inst_executed' $O/$f | head -1 | awk '{print $NF}')"; done
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h 'mixed step' $O/dec_$f.log | sed 's/.*first token after//')"; grep -E "^\| (512|1024|2048) " $O/dec_$f.log; done
