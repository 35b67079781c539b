#!/usr/bin/env bash
# Session 33, call 3: (a) whether this ncu can sample DRAM throughput over one whole decode step
# (PM sampling of a graph launch: where in the step HBM idles), qwen3-8b batch 1; (b) o and down
# six groups ahead (NERVA_KERNEL_DEFINES=MMA_DEEP_DEPTH_ADD=6: 128 registers, a 16-byte spill)
# against the default five, qwen3-8b and qwen3-0.6b batch 1 and 8, alternating twice.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
M=/tmp/nerva-models; mkdir -p $M
D6="NERVA_KERNEL_DEFINES=MMA_DEEP_DEPTH_ADD=6"
(.gpu/nervad make-model --preset qwen3-0.6b --out $M/qwen3-0.6b --seed 1234 >/dev/null;
 .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null) &
timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm.log 2>&1 &
env $D6 timeout 300 .gpu/gpu_kernels --tokens 1 --mma-tokens 1 --gemm-tokens "" --only none > $O/warm_d6.log 2>&1 &
(ncu --version; ncu --list-sections) > $O/ncu_sections.txt 2>&1
wait
echo "warm $(( $(date +%s) - T0 )) s" >> $O/times.txt
t1=$(date +%s)
timeout 150 ncu --graph-profiling graph --clock-control none --section PmSampling \
  --print-metric-instances values --launch-skip 20 --launch-count 2 -o $O/pm \
  .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 128 --tokens 48 --prefill "" > $O/ncu_pm.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
timeout 60 ncu --import $O/pm.ncu-rep --page raw --print-metric-instances values --csv > $O/ncu_pm_raw.csv 2>&1
echo "import rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
dec() { # name model env...
  local name=$1 model=$2; shift 2
  local t1=$(date +%s)
  env "$@" timeout 45 .gpu/gpu_decode --model $M/$model --batch 1,8 --prompt 128 --tokens 128 \
    --prefill "" > $O/dec_$name.log 2>&1
  echo "dec_$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
for r in a b; do
  dec 8b_d5_$r qwen3-8b X=0
  dec 8b_d6_$r qwen3-8b $D6
  dec 06b_d5_$r qwen3-0.6b X=0
  dec 06b_d6_$r qwen3-0.6b $D6
done
ls -la $O > $O/ls.txt
tar czf $OUT/r3.tgz -C $OUT r3
echo "===== summary"
cat $O/gpu.txt $O/times.txt
grep -i -E "pm|sampl|version" $O/ncu_sections.txt | head
head -c 1500 $O/ncu_pm.txt; echo; grep -c . $O/ncu_pm_raw.csv; head -c 600 $O/ncu_pm_raw.csv; echo
for f in $(ls $O | grep '^dec_' | sed 's/dec_//; s/.log//'); do echo "-- $f $(grep -h '^read bandwidth' $O/dec_$f.log | head -1 | cut -c1-40)"; grep -E "^\| (1|8) |rror|WARN|panick" $O/dec_$f.log; done
