#!/usr/bin/env bash
# Session 37, call 3 (run inline on the machine call 2 left warm, the models call 1 made): issue
# 8's sweep at 1, 8, 32, 128 and 256 streams under the new launch-shape threshold.
export NERVA_MMA_GEMM_PROMPT_FIT=192 NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r3; mkdir -p $O; M=/tmp/nerva-models; sock=/tmp/nerva-s.sock; rm -f $sock; t=$(date +%s)
.gpu/nervad --model $M/qwen3-8b --socket $sock --backend cuda --max-batch 256 --max-step-tokens 1024 > $O/daemon_sweep.log 2>&1 & pid=$!
for _ in $(seq 1 120); do [ -S $sock ] && break; sleep 1; done; echo "up $(( $(date +%s) - t )) s" > $O/times.txt; t=$(date +%s)
timeout 150 .gpu/nervactl --socket $sock bench --streams 1,8,32,128,256 --prompt-tokens 512 --max-tokens 256 --waves 1 --out $O/sweep.json > $O/sweep.log 2>&1
echo "sweep rc=$? $(( $(date +%s) - t )) s" >> $O/times.txt; kill $pid; wait $pid; tar czf $OUT/r3.tgz -C $OUT r3
cat $O/times.txt; grep -h "read bandwidth" $O/daemon_sweep.log | cut -c1-160; grep -E "^ +[0-9]+ +[0-9]" $O/sweep.log
