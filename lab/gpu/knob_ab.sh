#!/usr/bin/env bash
# A kernel knob's A/B on one binary (the GPU machine, from the repository root, `.gpu/` staged by
# lab/gpu/stage.sh): A runs with the defaults, B with the environment assignments given (e.g.
# NERVA_WG_WIDE=256, or NERVA_KERNEL_DEFINES="WG_HALF_TILE=1": defines enter the kernel cache
# key, so both sets of cubins live side by side).
#   OUT=$OUT bash lab/gpu/knob_ab.sh NAME VAR=VALUE...
# In order, each step's figures printed as it ends (a call cut short still shows them):
#   1. B's bits: the kernel-variant and batch-invariance GPU tests (while the model is made);
#   2. gpu_kernels' GEMMs under A and B (DAB_TOKENS, default 320,576,640,1088);
#   3. mixed steps of 64 decoders and a prompt chunk, A B A B (DAB_MIXED, default 64:512,64:256);
#   4. one prompt's prefill alone, A B (DAB_PREFILL tokens, default 2048; empty skips it);
#   5. issue 8's 64 streams (512-token prompts, 256 new tokens), A B A B while the elapsed time
#      is under DAB_BUDGET seconds (default 420).
# The logs go to /tmp/knob_ab/NAME and come back as $OUT/NAME.tgz only (the device returns at most
# 8 files). `.gpu/bins.tgz`, when present, is unpacked into .gpu first (the binaries gzipped keep
# the carried tree under 64 MiB). `.gpu/kcache.tgz`, when present, seeds the kernel cache
# (`nervad compile-kernels --arch 90 --cache-dir .gpu/kcache` on the dev machine, once plain and
# once with any defines).
set -u
name=$1; shift
knobs=("$@")
unset_knobs=()
for a in "${knobs[@]}"; do unset_knobs+=(-u "${a%%=*}"); done
export NERVA_CUDA_INCLUDE=${NERVA_CUDA_INCLUDE:-/usr/local/cuda/include}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nerva-cache}
O=/tmp/knob_ab/$name; mkdir -p "$O"
T0=$(date +%s)
[ -f .gpu/bins.tgz ] && tar xzf .gpu/bins.tgz -C .gpu
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > "$O/gpu.txt"
if [ -f .gpu/kcache.tgz ] && [ ! -d "$XDG_CACHE_HOME/nerva/kernels" ]; then
  mkdir -p "$XDG_CACHE_HOME/nerva" && tar xzf .gpu/kcache.tgz -C "$XDG_CACHE_HOME/nerva" &&
    mv "$XDG_CACHE_HOME/nerva/kcache" "$XDG_CACHE_HOME/nerva/kernels"
fi
M=/tmp/nerva-models; mkdir -p $M
elapsed() { echo $(( $(date +%s) - T0 )); }
# with A|B command...: the command under the setting
with() {
  local s=$1; shift
  if [ "$s" = B ]; then env "${knobs[@]}" "$@"; else env "${unset_knobs[@]}" "$@"; fi
}

t1=$(date +%s)
with B env NERVA_GPU_BIG=1 timeout 240 .gpu/cuda_backend --nocapture --test-threads 1 \
  kernel_variants_give_identical_bits tensor_projections_are_batch_invariant > "$O/tests.log" 2>&1 &
tests=$!
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
wait $tests
echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
echo "-- B's bits (${knobs[*]})"; grep -E "^test |test result|panicked" "$O/tests.log" | cut -c1-200

for s in A B; do
  t1=$(date +%s)
  with $s timeout 90 .gpu/gpu_kernels --tokens "" --mma-tokens "" --gemm-tokens "${DAB_TOKENS:-320,576,640,1088}" \
    --only qwen3-8b > "$O/kernels_$s.log" 2>&1
  echo "kernels_$s rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
  echo "-- gpu_kernels $s (T, WGS, WGT, WGT192, WGT144, cuBLAS, pick)"
  grep -E "^qwen3-8b" "$O/kernels_$s.log" | awk -F"|" '{print $1 "|" $7 "|" $8 "|" $9 "|" $10 "|" $11 "|" $13}'
done

for r in 1 2; do
  for s in A B; do
    t1=$(date +%s)
    with $s timeout 90 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 16 --prefill "" \
      --max-step-tokens 1024 --mixed "${DAB_MIXED:-64:512,64:256}" > "$O/mixed_$s$r.log" 2>&1
    echo "mixed_$s$r rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
    echo "-- mixed $s$r"; grep -E "mixed steps" "$O/mixed_$s$r.log" | sed 's/mixed steps: //'
  done
done

if [ -n "${DAB_PREFILL-2048}" ]; then
  for s in A B; do
    t1=$(date +%s)
    with $s timeout 90 .gpu/gpu_decode --model $M/qwen3-8b --batch 1 --prompt 128 --tokens 8 \
      --prefill "${DAB_PREFILL-2048}" --max-step-tokens 2048 > "$O/prefill_$s.log" 2>&1
    echo "prefill_$s rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
    echo "-- prefill $s (tokens | ms p50 | tok/s | steps | GPU ms | min / max | TFLOP/s)"
    grep -E "^\| ${DAB_PREFILL-2048} \|" "$O/prefill_$s.log"
  done
fi

sock=/tmp/nerva-knob-ab.sock
for r in 1 2; do
  for s in A B; do
    [ "$(elapsed)" -gt "${DAB_BUDGET:-420}" ] && break 2
    t1=$(date +%s)
    rm -f $sock
    with $s .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 \
      --max-step-tokens 1024 > "$O/daemon_s64_$s$r.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
    echo "daemon_s64_$s$r up after $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
    t1=$(date +%s)
    timeout 90 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
      --waves 1 --out "$O/s64_$s$r.json" > "$O/s64_$s$r.log" 2>&1
    echo "s64_$s$r rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
    kill $pid; wait $pid
    echo "-- 64 streams $s$r at $(elapsed) s"; grep -E "^ +64 " "$O/s64_$s$r.log"
  done
done

tar czf "$OUT/$name.tgz" -C /tmp/knob_ab "$name"
echo "===== summary (B: ${knobs[*]}, $(elapsed) s)"
cat "$O/gpu.txt" "$O/times.txt"
