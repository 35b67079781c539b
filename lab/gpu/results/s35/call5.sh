#!/usr/bin/env bash
# Session 35, call 5 (final source): the bit-identity test's new variant alone, serial attention
# from 1 token with its partials through global memory (`serial_parts_shared: false`, the path
# the shared partials replaced by default), on every preset the test runs.
set -u
export NERVA_CUDA_INCLUDE=/usr/local/cuda/include LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=/tmp/nerva-cache
O=$OUT/r5; mkdir -p $O
T0=$(date +%s)
t1=$(date +%s)
NERVA_GPU_BIG=1 NERVA_GPU_VARIANTS='partials through global' timeout 250 .gpu/cuda_backend \
  kernel_variants_give_identical_bits --nocapture > $O/bits.log 2>&1
echo "bits rc=$? $(( $(date +%s) - t1 )) s" >> $O/times.txt
echo "===== summary"
cat $O/times.txt
grep -E "^test |test result|panicked|differ|variant" $O/bits.log | cut -c1-200 | head -20
