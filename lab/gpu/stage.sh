#!/usr/bin/env bash
# Build everything the GPU machine runs and stage it in .gpu/ (git-ignored): the daemon, the
# client CLI, the GPU benches and the GPU test binary, stripped to keep what travels small.
#   lab/gpu/stage.sh        then: lab/gpu/run_cuda.sh .gpu OUT steps...
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --bins
cargo build --release -p nervad --benches --tests
mkdir -p .gpu
cp target/release/nervad target/release/nervactl .gpu/
newest() {
  ls -t target/release/deps/"$1"-* | grep -v '\.d$' | head -1
}
bins="gpu_decode gpu_kernels preemption cuda_backend"
for b in $bins; do cp "$(newest $b)" .gpu/$b; done
# Only what was just built: .gpu/ may also hold an older build kept for an A/B, or scripts.
(cd .gpu && strip nervad nervactl $bins)
du -sh .gpu
