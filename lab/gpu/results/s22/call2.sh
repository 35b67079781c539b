#!/usr/bin/env bash
# Session 20, call 2: the folded prompt attention two tiles per barrier (their scores side by side, and their softmax where one split;
# four stages), the softmax over its two rows side by side, o rescaled only once it is nonzero,
# o reset only at split ends: gpu_decode_base (4de47be) against gpu_decode, alternating twice;
# then the bit tests on the new kernels.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r2; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
dec() { # name binary
  local t1=$(date +%s)
  timeout 200 .gpu/$2 --model $M/qwen3-8b --batch 1,32,64 --prompt 512 --tokens 64 \
    --prefill 512,2048 --mixed 64:448,64:960 --max-step-tokens 1024 > $O/dec_$1.log 2>&1
  echo "dec_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec base_a gpu_decode_base
dec new_a gpu_decode
dec base_b gpu_decode_base
dec new_b gpu_decode
t1=$(date +%s)
NERVA_GPU_BIG=1 timeout 220 .gpu/cuda_backend --nocapture --test-threads 1 identical_bits > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
t0=$(date +%s)
timeout 120 ncu --graph-profiling node -k "regex:attn_prefill_fold" --launch-skip 50 --launch-count 1 --set full --import-source no -o $O/fold \
  .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 2 --prefill 2048 --max-step-tokens 2048 > $O/ncu_fold.log 2>&1
ncu -i $O/fold.ncu-rep --page details 2>&1 | grep -E 'Duration|Issued Ipc|Registers Per|Warp Cycles Per Issued|Executed Ipc|Achieved Occ|Executed Instructions' | head -20 > $O/fold_details.txt
ncu -i $O/fold.ncu-rep --page source --print-source sass --csv > /tmp/fold_sass.csv 2>/dev/null
python3 lab/gpu/ncu_sass_summary.py --top 20 /tmp/fold_sass.csv > $O/fold_stalls.txt 2>&1
rm -f $O/fold.ncu-rep
echo "ncu-fold $(( $(date +%s) - t0 )) s" >> $O/times.txt
tar czf $OUT/r2.tgz -C $OUT r2
echo "===== summary"
cat $O/times.txt
for f in base_a new_a base_b new_b; do echo "-- $f"; grep -E "^\| |mixed steps|panick|rror" $O/dec_$f.log | grep -v "^| batch\|^| prompt" | head -12; done
grep -E "^test |test result" $O/bits.log
cat $O/fold_details.txt
head -5 $O/fold_stalls.txt
