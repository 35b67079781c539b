#!/usr/bin/env bash
# Session 15, call 8 (main, GPU defaults + --max-tokens-spread): the daemon started without batch
# flags on the GPU (64 / 1024 now), issue 8's 64 streams on those defaults, and 8/32/64 streams
# with request lengths spread ±50% (arrivals no longer in step).
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $O/r8_gpu.txt
M=/tmp/nerva-models; mkdir -p $M
[ -f $M/qwen3-8b/config.json ] || .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null
sock=/tmp/nerva-defaults.sock
.gpu/nervad --model $M/qwen3-8b --socket $sock > $O/r8_daemon.log 2>&1 &
pid=$!
for _ in $(seq 1 200); do [ -S $sock ] && break; sleep 1; done
.gpu/nervactl --socket $sock status 2>&1 | grep -iE "backend|max_batch|max_step|batch|step" | head -8 | tee $O/r8_status.txt
timeout 150 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 --waves 1 --out $O/r8_fixed.json > $O/r8_fixed.log 2>&1
timeout 300 .gpu/nervactl --socket $sock bench --streams 8,32,64 --prompt-tokens 512 --max-tokens 256 --waves 2 --max-tokens-spread 0.5 --out $O/r8_spread.json > $O/r8_spread.log 2>&1
kill $pid; wait $pid
echo "===== summary"
grep -E "backend ready|nervad serving" $O/r8_daemon.log | cut -c1-260
cat $O/r8_status.txt
grep -E 'nervactl bench: [0-9]|STREAMS|^ +[0-9]+ +[0-9]|on cuda' $O/r8_fixed.log | cut -c1-250
grep -E 'nervactl bench: [0-9]|STREAMS|^ +[0-9]+ +[0-9]|on cuda' $O/r8_spread.log | cut -c1-250
