#!/usr/bin/env bash
# Session 15, call 4 (main 8074aca): issue 8's sweep at 1/8/32/64 streams and the fork; A/B
# against 2a5ede1 at batch 1/8/32/64, 512/2,048-token prompts and mixed steps; wg64s with capped
# blocks (NERVA_WG_STREAM=1, NERVA_WG_STREAM_BLOCKS) at batch 32/64.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r4_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
SWEEP_STREAMS=1,8,32,64 SWEEP_TIMEOUT=260 bash lab/gpu/run_cuda.sh .gpu $O/sw sweep > /dev/null 2>&1
cp $O/sw/sweep.log $O/r4_sweep.log; cp $O/sw/fork.log $O/r4_fork.log; cp $O/sw/daemon_sweep.log $O/r4_daemon_sweep.log; cp $O/sw/sweep.json $O/r4_sweep.json; rm -rf $O/sw
run() { # name env... -- args
  local name=$1; shift
  echo "== $name" >> $O/r4_decode.log
  env "$@" 2>&1 | grep -E "^\{|bandwidth|^\| [0-9]|WARN|mixed steps|panick|error" >> $O/r4_decode.log
}
G="--model $M/qwen3-8b --prompt 512 --tokens 64 --max-step-tokens 1024 --json"
run base timeout 110 .gpu/gpu_decode_base $G --batch 1,8,32,64 --prefill 512,2048
run new timeout 130 .gpu/gpu_decode $G --batch 1,8,32,64 --prefill 512,2048 --mixed 64:960
for b in 0 120 128; do run wg_stream_b$b NERVA_WG_STREAM=1 NERVA_WG_STREAM_BLOCKS=$b timeout 70 .gpu/gpu_decode $G --batch 32,64 --prefill ""; done
run wg_stream_off NERVA_WG_STREAM=0 timeout 70 .gpu/gpu_decode $G --batch 32,64 --prefill ""
echo "===== summary"
grep -E 'nervactl bench: |STREAMS|^ +[0-9]+ +[0-9]' $O/r4_sweep.log | cut -c1-250
grep -iE 'x faster|pages|fork' $O/r4_fork.log | head -6
grep -vE '^\{' $O/r4_decode.log | cut -c1-150
