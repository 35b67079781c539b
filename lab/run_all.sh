#!/usr/bin/env bash
# Builds the lab once in release and runs all six experiments in sequence; every experiment
# ends with a markdown table ready to paste into lab/README.md.
#
#   lab/run_all.sh            # full runs (~2-3 minutes in all)
#   lab/run_all.sh --quick    # smoke test: tiny sizes, a few seconds
#   LAB_BIN=dir lab/run_all.sh  # run prebuilt binaries from dir (e.g. copied to another host)
#
# Run it on a quiet machine: the ping-pong and throughput figures are meaningless while other
# work competes for the cores.
set -euo pipefail
cd "$(dirname "$0")/.."

experiments=(01_false_sharing 02_ring_compare 03_hugepages_tlb 04_wakeup_cost 05_doorbell_batching 06_memory_ordering)

if [[ -z "${LAB_BIN:-}" ]]; then
    cargo build -p nerva-lab --release --bins
    LAB_BIN="$(cargo metadata --format-version 1 --no-deps 2>/dev/null \
        | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release"
fi

echo "# Nerva lab run"
echo
echo "- $(uptime)"
echo "- $(lscpu 2>/dev/null | grep 'Model name' | tr -s ' ')"
echo "- cpus: $(nproc), kernel $(uname -r)"
for exp in "${experiments[@]}"; do
    "$LAB_BIN/$exp" "$@"
done
