#!/usr/bin/env bash
# Session 37, call 1: the wgmma GEMM's launch shapes priced by its prompt fit from 192 tokens
# (NERVA_MMA_GEMM_PROMPT_FIT=192) instead of 512 (the default): gpu_kernels' projections at
# 128-1,024 tokens with the backend's pick under each; mixed steps (64 decoders + a 128-960-token
# chunk; also checks the --mixed fix) alternating; 64 streams alternating, with the fastest mode
# (--projections blas) beside them for issue 8's ratio.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r1; mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $O/gpu.txt
mkdir -p $XDG_CACHE_HOME/nerva && tar xzf .gpu/kcache.tgz -C $XDG_CACHE_HOME/nerva && mv $XDG_CACHE_HOME/nerva/kcache $XDG_CACHE_HOME/nerva/kernels
M=/tmp/nerva-models; mkdir -p $M
(t=$(date +%s); .gpu/nervad make-model --preset qwen3-8b --out $M/qwen3-8b --seed 1234 >/dev/null; echo "model $(( $(date +%s) - t )) s" >> $O/times.txt) &
TOK=128,192,256,320,384,448,576,640,768,1024
kern() { # name fit
  local t1=$(date +%s)
  NERVA_MMA_GEMM_PROMPT_FIT=$2 timeout 150 .gpu/gpu_kernels --tokens "" --mma-tokens "" --gemm-tokens $TOK --only qwen3-8b > $O/kernels_$1.log 2>&1
  echo "kernels_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
kern f512 512; kern f192 192
wait
dec() { # name fit
  local t1=$(date +%s)
  NERVA_MMA_GEMM_PROMPT_FIT=$2 timeout 100 .gpu/gpu_decode --model $M/qwen3-8b --batch 64 --prompt 512 --tokens 16 --prefill "" \
    --max-step-tokens 1024 --mixed 64:128,64:192,64:256,64:320,64:384,64:448,64:512,64:960 > $O/mixed_$1.log 2>&1
  echo "mixed_$1 rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
}
dec f512a 512; dec f192a 192; dec f512b 512; dec f192b 192
sock=/tmp/nerva-s.sock
s64() { # name fit flags...
  local name=$1 fit=$2; shift 2
  local t1=$(date +%s)
  rm -f $sock
  NERVA_MMA_GEMM_PROMPT_FIT=$fit .gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 "$@" > $O/daemon_$name.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done
  echo "daemon_$name up after $(( $(date +%s) - t1 )) s" >> $O/times.txt
  t1=$(date +%s)
  timeout 120 .gpu/nervactl --socket $sock bench --streams 64 --prompt-tokens 512 --max-tokens 256 \
    --waves 1 --out $O/$name.json > $O/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
  kill $pid; wait $pid
}
for r in a b; do
  [ $(( $(date +%s) - T0 )) -gt 470 ] && break
  s64 s64_f512$r 512; s64 s64_f192$r 192; s64 s64_blas$r 512 --projections blas
done
tar czf $OUT/r1.tgz -C $OUT r1
echo "===== summary"
cat $O/gpu.txt $O/times.txt
for n in f512 f192; do echo "-- kernels $n"; grep -E "^qwen3-8b" $O/kernels_$n.log | awk -F'|' '{print $1 "|" $5 "|" $6 "|" $7 "|" $8 "|" $9 "|" $10 "|" $11}'; done
for n in f512a f192a f512b f192b; do echo "-- mixed $n"; grep -E "^\| [0-9]|mixed steps" $O/mixed_$n.log | sed 's/mixed steps: //'; done
for n in s64_f512a s64_f192a s64_blasa s64_f512b s64_f192b s64_blasb; do echo "-- $n"; grep -E "^ +64 " $O/$n.log; done
