#!/usr/bin/env bash
# Session 28, call 1 (main + MMA_N1_DEPTH / MMA_DEEP_DEPTH overridable by NERVA_KERNEL_DEFINES):
# batch-1 and batch-8 decode of qwen3-8b on this card with the knobs that need no new kernels,
# alternating twice: the default, decode attention's L2 prefetch of the next weights (8 / 16 /
# 32 MiB), every one-token projection on the deep variant (NERVA_MMA_DEEP=1000); the
# projections alone at one token; one decode layer under ncu; then, if time is left, the deep
# variant with 6 groups in flight (a new cubin).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
echo "model $(( $(date +%s) - T0 )) s" >> $O/times.txt
dec() { # name env...
  local n=$1; shift
  local t1=$(date +%s)
  env "$@" timeout 200 .gpu/gpu_decode --model $M/qwen3-8b --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$n.log 2>&1
  echo "dec_$n rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec warm X=0
for r in a b; do
  [ $(( $(date +%s) - T0 )) -lt 330 ] || break
  dec base_$r X=0
  dec p8_$r NERVA_L2_PREFETCH_MIB=8
  dec p16_$r NERVA_L2_PREFETCH_MIB=16
  dec p32_$r NERVA_L2_PREFETCH_MIB=32
  dec deep_$r NERVA_MMA_DEEP=1000
done
t1=$(date +%s)
timeout 60 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only qwen3-8b > $O/kernels.log 2>&1
echo "kernels rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
if [ $(( $(date +%s) - T0 )) -lt 420 ]; then
  t1=$(date +%s)
  timeout 90 ncu --graph-profiling node --clock-control none -k "regex:mma_|attn_decode" --launch-skip 150 --launch-count 5 \
    --section SpeedOfLight --section Occupancy --metrics dram__bytes_read.sum,gpu__time_duration.sum \
    .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --tokens 48 --prefill "" --buffer-mib 256 > $O/ncu_layer.txt 2>&1
  echo "ncu rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
fi
if [ $(( $(date +%s) - T0 )) -lt 380 ]; then
  dec d6 NERVA_KERNEL_DEFINES=MMA_DEEP_DEPTH=6
fi
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log)"; grep -E "^\| (1|8) " $O/dec_$f.log; done
grep -E "qwen3-8b" $O/kernels.log
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|dram__bytes|Achieved Occ" $O/ncu_layer.txt | head -40
