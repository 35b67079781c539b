#!/usr/bin/env bash
# Session 19, call 1: the prompt attention folded in its blocks (attn_prefill_fold) and every
# merge as the splits' fold: (a) the bit tests (0.6B included); (b) gpu_decode with the fold off
# (NERVA_ATTN_FOLD=0), from 1,024 rows (the default) and from 1 row, alternating twice: prompts
# of 512/1,024/2,048 tokens, mixed steps 64:448 and 64:960, batch 1 and 64; (c) the GEMM peak
# (gpu_kernels); (d) the L2 look-ahead define WG_L2_AHEAD=8 against none at batch 32/64.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
t0=$(date +%s)
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - t0 )) s" >> $O/times.txt
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 200 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
dec() { # name env...
  local name=$1 t1=$(date +%s); shift
  env "$@" timeout 150 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,64 --prompt 512 --tokens 64 \
    --prefill 512,1024,2048 --mixed 64:448,64:960 --max-step-tokens 1024 > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec off_a NERVA_ATTN_FOLD=0
dec def_a X=1
dec all_a NERVA_ATTN_FOLD=1
dec off_b NERVA_ATTN_FOLD=0
dec def_b X=1
dec all_b NERVA_ATTN_FOLD=1
t1=$(date +%s)
timeout 120 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens 2048 --only qwen3-8b/down > $O/peak.log 2>&1
echo "peak rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
l2() { # name env...
  local name=$1 t1=$(date +%s); shift
  env "$@" timeout 150 .gpu/gpu_decode --model $M/qwen3-8b --batch 32,64 --prompt 512 --tokens 128 \
    --prefill "" --max-step-tokens 1024 > $O/l2_$name.log 2>&1
  echo "l2_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
l2 ahead8_a NERVA_KERNEL_DEFINES="WG_L2_AHEAD=8"
l2 none_a X=1
l2 ahead8_b NERVA_KERNEL_DEFINES="WG_L2_AHEAD=8"
l2 none_b X=1
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/times.txt
grep -E "^test |test result|bit-identical" $O/bits.log | head -30
for f in off_a def_a all_a off_b def_b all_b; do echo "-- $f"; grep -E "bandwidth|^\| |panick|rror" $O/dec_$f.log | head -16; done
grep -E "peak|rror" $O/peak.log
for f in ahead8_a none_a ahead8_b none_b; do echo "-- $f"; grep -E "^\| |panick|rror" $O/l2_$f.log | head -6; done
