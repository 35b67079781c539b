#!/usr/bin/env bash
# Session 15, call 1: mixed steps' decode rows through the decode attention (NERVA_ATTN_MIXED
# 0/1, same binary), the serial triples (NERVA_ATTN_SERIAL_TRIPLES 0/1) against main (2a5ede1),
# issue 8's sweep at 64 streams with mixed 0/1.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $O/r1_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
run() { # name env... -- args
  local name=$1; shift
  echo "== $name" >> $O/r1_decode.log
  env "$@" 2>&1 | grep -E "^\{|bandwidth|^\| [0-9]|WARN|mixed steps|panick|error" >> $O/r1_decode.log
}
G="--model $M/qwen3-8b --prompt 512 --tokens 64 --max-step-tokens 1024 --json"
run mixed0 NERVA_ATTN_MIXED=0 timeout 150 .gpu/gpu_decode $G --batch 64 --prefill "" --mixed 8:1016,32:992,64:960
run mixed1 NERVA_ATTN_MIXED=1 timeout 150 .gpu/gpu_decode $G --batch 64 --prefill "" --mixed 8:1016,32:992,64:960
run base   timeout 120 .gpu/gpu_decode_base $G --batch 8,32,64 --prefill 512
run triples0 NERVA_ATTN_SERIAL_TRIPLES=0 timeout 120 .gpu/gpu_decode $G --batch 8,32,64 --prefill 512
run triples1 NERVA_ATTN_SERIAL_TRIPLES=1 timeout 120 .gpu/gpu_decode $G --batch 8,32,64 --prefill ""
for m in 0 1; do
  NERVA_ATTN_MIXED=$m SWEEP_STREAMS=64 SWEEP_FORK=0 SWEEP_TIMEOUT=150 bash lab/gpu/run_cuda.sh .gpu $O/sw$m sweep > $O/r1_sweep_console_$m.log 2>&1
  cp $O/sw$m/sweep.log $O/r1_sweep_mixed$m.log; cp $O/sw$m/daemon_sweep.log $O/r1_daemon_mixed$m.log
done
echo "===== summary"
grep -vE '^\{' $O/r1_decode.log | cut -c1-150
for m in 0 1; do echo "-- sweep NERVA_ATTN_MIXED=$m"; grep -E 'nervactl bench: 64|^ +64 ' $O/r1_sweep_mixed$m.log; done
