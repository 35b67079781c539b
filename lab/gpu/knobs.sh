#!/usr/bin/env bash
# Several kernel knobs against each other in one machine start (the GPU machine, from the
# repository root, `.gpu/` staged by lab/gpu/stage.sh). Each argument is a variant
# NAME:VAR=VALUE,... (an empty list is the defaults; every knob any variant sets is unset for the
# others), e.g.
#   OUT=$OUT BITS=H bash lab/gpu/knobs.sh A: W:NERVA_WG_WIDE=256 H:NERVA_KERNEL_DEFINES=WG_HALF_TILE=1
# In order, each step's figures printed as it ends (a call cut short still shows them):
#   1. the kernel-variant and batch-invariance GPU tests under variant $BITS (default: the last;
#      the bit-identity test runs every tile form, so the one variant with kernel defines covers
#      the rest), or with KN_TESTS=all every GPU test, while the model is made;
#   2. gpu_kernels' GEMMs under the first variant and each with kernel defines (the pick
#      column is the variant's launch; the WGT192 and WGT144 columns time those tiles whatever
#      the knobs; KN_TOKENS);
#   3. one gpu_decode per variant: decode at batch 64, mixed steps of 64 decoders and a prompt
#      chunk (KN_MIXED, default 64:512,64:256), one 2,048-token prompt alone (KN_PREFILL);
#   4. issue 8's 64 streams (512-token prompts, 256 new tokens), a round over the variants (and,
#      with KN_BLAS=1, the defaults with `--projections blas`, the fastest mode) while the
#      elapsed time is under KN_BUDGET seconds (default 440), repeated if time remains;
#   5. with KN_SWEEP=1,8,... (and under KN_BUDGET + 60 s), issue 8's other stream counts under
#      the first variant, in one daemon.
# Logs go to /tmp/knobs and come back as $OUT/knobs.tgz only (the device returns at most 8
# files). `.gpu/bins.tgz`, when present, is unpacked into .gpu first (the binaries gzipped keep
# the carried tree under 64 MiB). `.gpu/kcache.tgz`, when present, seeds the kernel cache
# (`nervad compile-kernels --arch 90 --cache-dir .gpu/kcache` on the dev machine, once plain and
# once with any defines).
set -u
export NERVA_CUDA_INCLUDE=${NERVA_CUDA_INCLUDE:-/usr/local/cuda/include}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nerva-cache}
O=/tmp/knobs; mkdir -p "$O"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
declare -A sets
names=(); all_vars=()
for v in "$@"; do
  n=${v%%:*}; names+=("$n"); sets[$n]=${v#*:}
  IFS=, read -ra as <<< "${sets[$n]}"
  for a in "${as[@]}"; do [ -n "$a" ] && all_vars+=(-u "${a%%=*}"); done
done
# with NAME command...: the command under variant NAME
with() {
  local n=$1; shift
  local as=(); IFS=, read -ra as <<< "${sets[$n]}"
  env "${all_vars[@]}" "${as[@]}" "$@"
}
has_defines() { [[ ${sets[$1]} == *NERVA_KERNEL_DEFINES* ]]; }

[ -f .gpu/bins.tgz ] && tar xzf .gpu/bins.tgz -C .gpu
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > "$O/gpu.txt"
if [ -f .gpu/kcache.tgz ] && [ ! -d "$XDG_CACHE_HOME/nerva/kernels" ]; then
  mkdir -p "$XDG_CACHE_HOME/nerva" && tar xzf .gpu/kcache.tgz -C "$XDG_CACHE_HOME/nerva" &&
    mv "$XDG_CACHE_HOME/nerva/kcache" "$XDG_CACHE_HOME/nerva/kernels"
fi
M=/tmp/nerva-models; mkdir -p $M

bits=${BITS:-${names[-1]}}
t1=$(date +%s)
tests_named=(kernel_variants_give_identical_bits tensor_projections_are_batch_invariant)
[ "${KN_TESTS:-bits}" = all ] && tests_named=()
with "$bits" env NERVA_GPU_BIG=1 timeout 300 .gpu/cuda_backend --nocapture --test-threads 1 \
  "${tests_named[@]}" > "$O/tests.log" 2>&1 &
tests=$!
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
wait $tests
echo "tests ($bits) rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
echo "-- bits under $bits (${sets[$bits]})"; grep -E "^test |test result|panicked" "$O/tests.log" | cut -c1-200

for n in "${names[@]}"; do
  [ "$n" = "${names[0]}" ] || has_defines "$n" || continue
  t1=$(date +%s)
  with "$n" timeout 120 .gpu/gpu_kernels --tokens "" --mma-tokens "" \
    --gemm-tokens "${KN_TOKENS:-192,320,576,640,1088,2048}" --only qwen3-8b > "$O/kernels_$n.log" 2>&1
  echo "kernels_$n rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
  echo "-- gpu_kernels $n (T, WGS, WGT, WGT192, WGT144, cuBLAS, pick)"
  grep -E "^qwen3-8b" "$O/kernels_$n.log" | awk -F"|" '{print $1 "|" $7 "|" $8 "|" $9 "|" $10 "|" $11 "|" $13}'
  grep -E "GEMM peak" "$O/kernels_$n.log"
done

for n in "${names[@]}"; do
  t1=$(date +%s)
  with "$n" timeout 120 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 16 \
    --prefill "${KN_PREFILL-2048}" --max-step-tokens 2048 --mixed "${KN_MIXED:-64:512,64:256}" \
    > "$O/decode_$n.log" 2>&1
  echo "decode_$n rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
  echo "-- gpu_decode $n: batch 64 | mixed steps | prompt (tokens | ms p50 | tok/s | steps | GPU ms | min / max | TFLOP/s)"
  grep -E "^\| +64 \|" "$O/decode_$n.log" | head -1
  grep -E "mixed steps" "$O/decode_$n.log" | sed 's/mixed steps: //'
  grep -E "^\| ${KN_PREFILL-2048} \|" "$O/decode_$n.log"
done

sock=/tmp/nerva-knobs.sock
# daemon NAME LOG ARGS...: a daemon under variant NAME, up (or given up on after 120 s)
daemon() {
  local n=$1 log=$2; shift 2
  rm -f $sock
  with "$n" .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 \
    --max-step-tokens 1024 "$@" > "$log" 2>&1 &
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
}
# stop: the daemon gone, its device memory free (`with` runs it in a subshell: kill it by name)
stop() {
  pkill -f "nervad --model $M/qwen3-8b --socket $sock"
  for _ in $(seq 1 60); do pgrep -f "nervad --model $M/qwen3-8b --socket $sock" >/dev/null || break; sleep 0.5; done
}
rounds=("${names[@]}"); [ "${KN_BLAS:-0}" = 1 ] && rounds+=(blas)
sets[blas]=""
for r in 1 2; do
  for n in "${rounds[@]}"; do
    [ "$(elapsed)" -gt "${KN_BUDGET:-440}" ] && break 2
    t1=$(date +%s)
    if [ "$n" = blas ]; then daemon blas "$O/daemon_s64_$n$r.log" --projections blas
    else daemon "$n" "$O/daemon_s64_$n$r.log"; fi
    echo "daemon_s64_$n$r up after $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
    t1=$(date +%s)
    timeout 90 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
      --waves 1 --out "$O/s64_$n$r.json" > "$O/s64_$n$r.log" 2>&1
    echo "s64_$n$r rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
    stop
    echo "-- 64 streams $n$r at $(elapsed) s"; grep -E "^ +64 " "$O/s64_$n$r.log"
  done
done

if [ -n "${KN_SWEEP:-}" ] && [ "$(elapsed)" -lt $(( ${KN_BUDGET:-440} + 60 )) ]; then
  n=${names[0]}; t1=$(date +%s)
  daemon "$n" "$O/daemon_sweep_$n.log"
  timeout 150 .gpu/nervactl --socket $sock bench --streams "$KN_SWEEP" --prompt-tokens 512 \
    --max-tokens 256 --waves 1 --out "$O/sweep_$n.json" > "$O/sweep_$n.log" 2>&1
  echo "sweep_$n rc=$? $(( $(date +%s) - t1 )) s" >> "$O/times.txt"
  stop
  echo "-- sweep $n at $(elapsed) s"; grep -E "^ +[0-9]+ +[0-9]" "$O/sweep_$n.log"
fi

tar czf "$OUT/knobs.tgz" -C /tmp knobs
echo "===== summary ($(elapsed) s)"
for n in "${names[@]}"; do echo "$n: ${sets[$n]}"; done
cat "$O/gpu.txt" "$O/times.txt"
