#!/usr/bin/env bash
# Session 27, call 1: the prompt attention's fold on wgmma (attn_prefill_wg; same bits): the bit
# tests (the fold on wgmma against the baseline's attn_split and the decode kernels, and the
# mma.sync fold as a variant), then the same binary with NERVA_ATTN_WGMMA=0 (the mma.sync fold)
# and default (wgmma) alternating: a 2,048-token prompt, a 512-token prompt, a 64 + 512 mixed step.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null &
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 260 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
wait
dec() { # name wgmma
  local t1=$(date +%s)
  NERVA_ATTN_WGMMA=$2 timeout 80 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 32 \
    --prefill 2048,512 --mixed 64:512 --max-step-tokens 2048 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 470 ] || break
  dec mma_$r 0
  dec wg_$r 1
done
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -E "^test |test result|panick|differ|bit-identical" $O/bits.log | head -20
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f"; grep -E "^\| |panick|rror" $O/dec_$f.log | grep -v "^|---" | head -12; done
