#!/usr/bin/env bash
# The CUDA backend's whole GPU-machine run in one go (the machine keeps nothing between runs):
# parity against the CPU reference and transformers, the decode benchmark against the read
# bandwidth measured in the same run, and the PyTorch peer on the same checkpoints.
#
#   lab/gpu/run_cuda.sh BIN_DIR OUT_DIR [wgmma-bits] [pdl] [variants] [ncu] [ncu-prefill] [ncu-gemm] [ncu-step] [kernels] [parity-tiny] [parity-big] [bench-small] [bench-8b] [batch-small] [batch-8b] [sweep] [preempt] [tests] [client] [peer]
#
# BIN_DIR holds nervad, nervactl, gpu_decode, gpu_kernels, preemption and cuda_backend built on the development machine.
set -u
B=$(realpath "${1:-.gpu}"); O=${2:-/tmp/nerva-gpu-out}; shift 2 || true
steps="${*:-parity-tiny bench-small parity-big bench-8b peer}"
mkdir -p "$O"
export NERVA_CUDA_INCLUDE=${NERVA_CUDA_INCLUDE:-/usr/local/cuda/include}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nerva-cache}
export PYTHONUNBUFFERED=1
M=/tmp/nerva-models
mkdir -p $M
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$O/gpu.txt"
has() { [[ " $steps " == *" $1 "* ]]; }
model() { [ -f "$M/$1/config.json" ] || "$B/nervad" make-model --preset "$1" --out "$M/$1" --seed 1234 >/dev/null; }
# Per-kernel totals of an ncu log of gpu__time_duration: microseconds, share, launches, grid.
ncu_times() {
  python3 - "$1" <<'PY'
import re, sys, collections
tot = collections.OrderedDict(); name = None
for line in open(sys.argv[1]):
    m = re.match(r"\s\s(\S+) \((\d+), (\d+), (\d+)\)x", line)
    if m: name = m.group(1) + " grid(%s,%s,%s)" % m.groups()[1:]; continue
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(2).replace(",", "")); v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3}.get(m.group(1), 1)
        tot.setdefault(name, []).append(v); name = None
all_us = sum(sum(v) for v in tot.values())
for k, v in sorted(tot.items(), key=lambda kv: -sum(kv[1])):
    print(f"{sum(v):10.1f} us {100*sum(v)/all_us:5.1f}%  x{len(v)}  {k}")
print(f"{all_us:10.1f} us total")
PY
}

if has wgmma-bits; then
  # Whether wgmma (A from registers, B from shared memory) gives mma.sync's bits (lab/gpu/wgmma_bits.cu).
  src=$(dirname "$0")/wgmma_bits.cu
  /usr/local/cuda/bin/nvcc -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_bits "$src" && /tmp/wgmma_bits 2>&1 | tee "$O/wgmma_bits.log"
fi
if has kernels; then
  # The projections alone (ours, the previous design, cuBLAS) against the read bandwidth.
  timeout 300 "$B/gpu_kernels" 2>&1 | tee "$O/kernels.log"
fi
if has pdl; then
  # Programmatic dependent launch on and off (NERVA_PDL), A/B in one run: batch-1 and batch-8
  # decode of both shapes and both projection kernels, each setting in its own process.
  for p in qwen3-0.6b qwen3-8b; do
    model $p
    for pdl in 0 1; do
      for proj in tensor gemv; do
        echo "== $p pdl=$pdl projections=$proj"
        NERVA_PDL=$pdl timeout 120 "$B/gpu_decode" --model $M/$p --batch ${PDL_BATCH:-1,8} \
          --prefill "" --projections $proj --json 2>&1 | grep -E "^\{|bandwidth|^\| [0-9]"
      done
    done
  done 2>&1 | tee "$O/pdl.log"
fi
if has variants; then
  # The speed-only kernel variants (KernelTuning): the baseline (every variant off, row-major
  # weights), the defaults, and the defaults with each variant off in turn, each setting in its
  # own process; bits are the same (GPU test kernel_variants_give_identical_bits).
  # NERVA_MMA_DEEP = blocks per SM up to which one-n-tile projections run deep;
  # NERVA_ATTN_SERIAL = decode tokens from which attention runs one block per (token, kv head);
  # NERVA_ATTN_CLUSTER = split blocks merge in a cluster; NERVA_MMA_PREPARED = tokens from which
  # inputs are prepared by to_half; NERVA_MMA_SPLIT = token tiles split over blocks;
  # NERVA_TILED_WEIGHTS = weights in the mma kernels' tiled layout; NERVA_MMA_GEMM = tokens from
  # which launches run the fixed-order GEMM (NERVA_MMA_GEMM_NARROW: its 64-token tiles where
  # they take fewer waves); NERVA_L2_PREFETCH_MIB = MiB of the next weights decode
  # attention asks into L2.
  cfgs=("NERVA_KERNEL_BASELINE=1" "NERVA_PDL=1" "NERVA_TILED_WEIGHTS=0" "NERVA_MMA_DEEP=0"
        "NERVA_MMA_PREPARED=0" "NERVA_MMA_SPLIT=0" "NERVA_ATTN_SERIAL=0" "NERVA_ATTN_CLUSTER=1"
        "NERVA_MMA_GEMM=0" "NERVA_MMA_GEMM_NARROW=1" "NERVA_L2_PREFETCH_MIB=16")
  # VARIANT_CFGS="A;B" replaces the list.
  [ -n "${VARIANT_CFGS:-}" ] && IFS=';' read -r -a cfgs <<< "$VARIANT_CFGS"
  for p in ${VARIANT_MODELS:-qwen3-0.6b qwen3-8b}; do
    model $p
    for cfg in "${cfgs[@]}"; do
      echo "== $p $cfg"
      env $cfg timeout 150 "$B/gpu_decode" --model $M/$p --batch ${VARIANT_BATCH:-1,8,32,64} --prompt ${VARIANT_PROMPT:-128} \
        --prefill "${VARIANT_PREFILL-1024}" --max-step-tokens ${VARIANT_STEP:-256} --json 2>&1 | grep -E "^\{|bandwidth|^\| [0-9]|WARN|prefill|^kernels:|^load"
    done
  done 2>&1 | tee -a "$O/variants.log"
fi
if has ncu; then
  # One 8B decode layer per projection mode, each kernel profiled alone (ncu serializes them
  # and runs at base clocks: compare kernels with each other, not with the timed runs).
  model qwen3-8b
  for proj in tensor gemv; do
    timeout 120 ncu --graph-profiling node -k "regex:mma_|gemv_|attn_decode" --launch-skip 150 --launch-count 5 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --metrics lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum \
      "$B/gpu_decode" --model $M/qwen3-8b --batch 1 --tokens 48 --prefill "" --buffer-mib 256 \
      --projections $proj > "$O/ncu_$proj.txt" 2>&1
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occ|lts__t_req|lts__t_sec|dram__bytes" "$O/ncu_$proj.txt"
  done 2>&1 | tee "$O/ncu_summary.log"
fi
if has ncu-prefill && command -v ncu >/dev/null; then
  # Where a 2,048-token prompt's step spends its time: the first layers' prefill kernels, each
  # timed alone by ncu (serialized, base clocks: shares, not absolute speed; NCU_CLOCKS=none
  # leaves the card's own clocks, to compare with the timed runs; NCU_PREFILL_STEP=1024 chunks
  # the prompt as the timed runs do).
  model qwen3-8b
  # The first 396 matching launches are the decode table's 128-token prompt (36 layers × 11).
  timeout 300 ncu --graph-profiling node --clock-control ${NCU_CLOCKS:-base} \
    -k "regex:attn_split|attn_combine|attn_prefill|rope_append|_gemm|_wg|to_half" \
    --launch-skip ${NCU_PREFILL_SKIP:-396} --launch-count ${NCU_PREFILL_LAUNCHES:-33} \
    --metrics gpu__time_duration.sum \
    "$B/gpu_decode" --model $M/qwen3-8b --batch 1 --tokens 2 --prefill ${NCU_PREFILL:-2048} \
    --max-step-tokens ${NCU_PREFILL_STEP:-${NCU_PREFILL:-2048}} > "$O/ncu_prefill.txt" 2>&1
  ncu_times "$O/ncu_prefill.txt" | tee "$O/ncu_prefill_summary.log"
fi
if has parity-tiny; then
  timeout 300 python3 tests/parity/parity.py --nervad "$B/nervad" --backend cuda --device cuda \
    --presets tiny,tiny-llama,tiny-qwen2,tiny-mistral --workdir /tmp/parity-tiny 2>&1 | tee "$O/parity_tiny.log"
fi
if has bench-small; then
  model qwen3-0.6b
  timeout 240 "$B/gpu_decode" --model $M/qwen3-0.6b --batch 1,8 --json 2>&1 | tee "$O/bench_qwen3-0.6b.log"
fi
if has parity-big; then
  for p in qwen3-0.6b llama3-1b qwen2.5-0.5b; do model $p; done
  timeout 900 python3 tests/parity/parity.py --nervad "$B/nervad" --backend cuda --device cuda \
    --presets qwen3-0.6b,llama3-1b,qwen2.5-0.5b --checkpoint-root $M --workdir /tmp/parity-big 2>&1 | tee "$O/parity_big.log"
fi
if has bench-8b; then
  model qwen3-8b
  timeout 600 "$B/gpu_decode" --model $M/qwen3-8b --batch 1,8 --json 2>&1 | tee "$O/bench_qwen3-8b.log"
fi
# Decode throughput by batch size, the batch-invariant tensor-core projections against the GEMV.
batch_sweep() {
  model $1
  timeout 400 "$B/gpu_decode" --model $M/$1 --batch 1,8,32,64,128 --prefill "" --json 2>&1 | tee "$O/batch_$1_tensor.log"
  timeout 300 "$B/gpu_decode" --model $M/$1 --batch 1,8,64 --prefill "" --projections gemv --json 2>&1 | tee "$O/batch_$1_gemv.log"
  timeout 300 "$B/gpu_decode" --model $M/$1 --batch 1,64 --prefill "" --projections mixed --json 2>&1 | tee "$O/batch_$1_mixed.log"
}
if has batch-small; then batch_sweep qwen3-0.6b; fi
if has batch-8b; then batch_sweep qwen3-8b; fi
if has ncu-step && command -v ncu >/dev/null; then
  # Where one decode step of NCU_STEP_BATCH (64) sequences over 512-token prompts spends its
  # time: the kernels of about one step past the prompts (16 steps of 2,048 tokens) and the 8
  # warm-up steps, each timed alone by ncu (serialized, base clocks: shares only).
  model qwen3-8b
  timeout 300 ncu --graph-profiling node --launch-skip ${NCU_STEP_SKIP:-11000} --launch-count ${NCU_STEP_LAUNCHES:-420} \
    --metrics gpu__time_duration.sum \
    "$B/gpu_decode" --model $M/qwen3-8b --batch ${NCU_STEP_BATCH:-64} --prompt 512 --tokens 64 --prefill "" \
    --max-step-tokens 2048 > "$O/ncu_step.txt" 2>&1
  ncu_times "$O/ncu_step.txt" | tee "$O/ncu_step_summary.log"
fi
if has ncu-gemm && command -v ncu >/dev/null; then
  # The wgmma GEMM at one token count (NCU_GEMM_TOKENS, default 64) on the shapes NCU_GEMM_SHAPES
  # names, each launch profiled alone with source-level (SASS) stall samples, and to_half beside.
  # gpu_kernels times 12 replays of 20 launches: the first 960 matching launches are the mma.sync
  # GEMMs' to_half (2 × 240) and the 128-token wgmma GEMM with its to_half (480).
  for only in ${NCU_GEMM_SHAPES:-qwen3-8b/down qwen3-8b/gate_up}; do
    f=$(echo "$only" | tr / _)
    timeout 200 ncu --graph-profiling node -k "regex:_wg64?\$|to_half" --launch-skip ${NCU_GEMM_SKIP:-1000} --launch-count 2 \
      --set full --import-source no -o "$O/ncu_gemm_$f" \
      "$B/gpu_kernels" --tokens "" --mma-tokens "" --gemm-tokens ${NCU_GEMM_TOKENS:-64} --only "$only" \
      > "$O/ncu_gemm_$f.log" 2>&1
    ncu -i "$O/ncu_gemm_$f.ncu-rep" --print-details all > "$O/ncu_gemm_$f.txt" 2>&1
    ncu -i "$O/ncu_gemm_$f.ncu-rep" --page source --print-source sass --csv > "$O/ncu_gemm_${f}_sass.csv" 2>&1
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Registers Per|Achieved Occ|Issued Warp|Eligible Warps" "$O/ncu_gemm_$f.txt"
  done 2>&1 | tee "$O/ncu_gemm_summary.log"
fi
if has sweep; then
  # Issue 8's load: closed-loop streams from 4 client processes on qwen3-8b, then the fork.
  p=qwen3-8b; model $p
  sock=/tmp/nerva-sweep.sock
  "$B/nervad" --model $M/$p --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 \
    ${SWEEP_FLAGS:-} >"$O/daemon_sweep.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 180); do [ -S $sock ] && break; sleep 1; done
  timeout ${SWEEP_TIMEOUT:-400} "$B/nervactl" --socket $sock bench --streams ${SWEEP_STREAMS:-1,8,32,64,128,256} \
    --prompt-tokens 512 --max-tokens 256 --waves 1 --out "$O/sweep.json" 2>&1 | tee "$O/sweep.log"
  [ "${SWEEP_FORK:-1}" = 1 ] && timeout 120 "$B/nervactl" --socket $sock bench --fork 32 \
    --prompt-tokens 512 --max-tokens 128 --out "$O/fork.json" 2>&1 | tee "$O/fork.log"
  timeout 60 "$B/nervactl" --socket $sock stats 2>&1 | tail -40 >> "$O/sweep.log"
  kill $pid; wait $pid
fi
if has preempt; then
  # Preemption by swap against recompute on the device (issue 8).
  model qwen3-0.6b
  timeout 300 "$B/preemption" --backend cuda --preset qwen3-0.6b --model $M/qwen3-0.6b --seqs 32 \
    --prompt 256 --tokens 256 --kv-pages 256 2>&1 | tee "$O/preempt.log"
fi
if has tests; then
  # The GPU tests (they skip on machines without a device): the test binary built here.
  NERVA_GPU_BIG=1 timeout 600 "$B/cuda_backend" --nocapture --test-threads 1 2>&1 | tee "$O/cuda_tests.log"
fi
if has client; then
  # Batch-1 decode through a real client process: the daemon on CUDA, nervactl bench.
  for p in qwen3-0.6b qwen3-8b; do
    model $p
    sock=/tmp/nerva-$p.sock
    "$B/nervad" --model $M/$p --socket $sock --backend cuda --max-batch 8 >"$O/daemon_$p.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
    prompt=$(python3 -c 'print(" ".join(["word%d" % (i % 50) for i in range(120)]))')
    timeout 300 "$B/nervactl" --socket $sock bench --procs 1 --concurrency 1 --requests 6 \
      --max-tokens 256 --prompt "$prompt" 2>&1 | tee "$O/client_$p.log"
    timeout 60 "$B/nervactl" --socket $sock stats 2>&1 | tail -40 >> "$O/client_$p.log"
    timeout 60 "$B/nervactl" --socket $sock status 2>&1 | tail -12 >> "$O/client_$p.log"
    kill $pid; wait $pid
  done
fi
if has peer; then
  for p in qwen3-0.6b qwen3-8b; do
    model $p
    timeout 600 python3 lab/gpu/torch_peer.py --model $M/$p 2>&1 | tail -3 | tee -a "$O/peer.log"
  done
fi
echo "== summary"
grep -h "^| \|tok_s\|PASS\|FAIL\|bandwidth" "$O"/*.log 2>/dev/null | grep -v '^|---' | head -60
