#!/usr/bin/env bash
# Session 34, call 1: the two kernel defines the thirty-third session left for an A/B.
# ATTN_DECODE_MIN_BLOCKS=2 caps attn_decode at 128 registers (a 204-byte spill at d128) so one of
# o's deep blocks fits beside each attention block; MMA_ADD_EARLY=1 has o's and down's residual
# add read x right after pdl_enter. Default (df), each alone (am, ae) and both (ab), qwen3-8b and
# qwen3-0.6b batch 1 and 8, alternating twice.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
AM="NERVA_KERNEL_DEFINES=ATTN_DECODE_MIN_BLOCKS=2"
AE="NERVA_KERNEL_DEFINES=MMA_ADD_EARLY=1"
AB="NERVA_KERNEL_DEFINES=ATTN_DECODE_MIN_BLOCKS=2 MMA_ADD_EARLY=1"
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_df.log 2>&1 &
env "$AM" timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_am.log 2>&1 &
env "$AE" timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_ae.log 2>&1 &
env "$AB" timeout 400 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_ab.log 2>&1 &
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name model env
  local name=$1 model=$2 e=$3
  local t1=$(date +%s)
  env "$e" timeout 45 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  dec 8b_df_$r qwen3-8b X=0
  dec 8b_am_$r qwen3-8b "$AM"
  dec 8b_ae_$r qwen3-8b "$AE"
  dec 8b_ab_$r qwen3-8b "$AB"
  dec 06b_df_$r qwen3-0.6b X=0
  dec 06b_am_$r qwen3-0.6b "$AM"
  dec 06b_ae_$r qwen3-0.6b "$AE"
  dec 06b_ab_$r qwen3-0.6b "$AB"
done
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -h -E "rror|panick" $O/warm_*.log | head
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
