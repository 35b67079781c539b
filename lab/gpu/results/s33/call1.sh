#!/usr/bin/env bash
# Session 33, call 1: the tail prefetch (NERVA_TAIL_PREFETCH_KIB: each register-form projection
# asks L2 for the next projection's first weights once its blocks are done) at 0 / 4 / 8 / 16
# MiB, and cluster attention (NERVA_ATTN_CLUSTER=1) again on the current kernels.
# qwen3-8b and qwen3-0.6b batch 1 and 8 (issue 7's decode, prompt 128, 128 timed steps), the
# settings alternating twice, each in its own process.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 45 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  for m in 8b:qwen3-8b 06b:qwen3-0.6b; do
    n=${m%%:*}; model=${m#*:}
    dec ${n}_t0_$r $model X=0
    dec ${n}_t4_$r $model NERVA_TAIL_PREFETCH_KIB=4096
    dec ${n}_t8_$r $model NERVA_TAIL_PREFETCH_KIB=8192
    dec ${n}_t16_$r $model NERVA_TAIL_PREFETCH_KIB=16384
    dec ${n}_cl_$r $model NERVA_ATTN_CLUSTER=1
  done
done
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
