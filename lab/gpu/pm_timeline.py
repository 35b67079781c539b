#!/usr/bin/env python3
"""One decode step's DRAM read timeline from ncu's PM sampling (a graph launch profiled whole:
lab/gpu/pm_step.sh, i.e. `ncu --graph-profiling graph --section PmSampling ... -o R`, then
`ncu --import R.ncu-rep --page raw --print-metric-instances values --csv > R.csv`).

Prints the share of the step's samples by DRAM read throughput and, with --layer-ctas N, the
mean profile of a layer aligned on the sample where the layer's first kernel (N blocks, e.g.
q|k|v's 384 for qwen3-8b) launches, so where HBM idles inside a layer shows at a glance.

    lab/gpu/pm_timeline.py R.csv [--layer-ctas 350 --every 2] [--period 37] [--raw]
"""
import argparse
import csv


def series(path):
    rows = list(csv.reader(open(path)))
    head, row = rows[0], rows[2]

    def vec(key):
        for i, h in enumerate(head):
            if key in h:
                v = row[i]
                return [float(x.replace(",", "")) for x in v[v.index("(") + 1 : -1].split("; ")]
        raise SystemExit(f"no metric {key} in {path}")

    interval = next(row[i] for i, h in enumerate(head) if h == "profiler__pmsampler_interval_time")
    return (
        float(interval.split()[0]),
        vec("dramc__read_throughput"),
        vec("gr__ctas_launched_realtime"),
        vec("sm__cycles_active.avg"),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--layer-ctas", type=int, default=0)
    ap.add_argument("--period", type=int, default=0, help="samples per layer to profile")
    ap.add_argument(
        "--every", type=int, default=1,
        help="every n-th start only (where a later launch of the layer has as many blocks)",
    )
    ap.add_argument("--raw", action="store_true", help="print every active sample")
    a = ap.parse_args()
    dt, dram, ctas, active = series(a.csv)
    on = [i for i, x in enumerate(active) if x > 0]
    first, last = on[0], on[-1]
    span = range(first, last + 1)
    n = len(span)
    print(f"{n} samples of {dt} us ({n * dt:.0f} us), DRAM read mean {sum(dram[i] for i in span) / n:.1f}% of peak")
    for lo, hi in ((0, 25), (25, 50), (50, 75), (75, 90), (90, 101)):
        k = sum(1 for i in span if lo <= dram[i] < hi)
        print(f"  {lo:3d}-{min(hi, 100):3d}%: {k:5d} samples ({k * dt:7.0f} us)")
    if a.raw:
        for i in span:
            print(f"{(i - first) * dt:8.1f} us  dram {dram[i]:5.1f}%  ctas {ctas[i]:6.0f}")
    if a.layer_ctas:
        # A layer starts where its first kernel's blocks launch: the sample (with the one before)
        # that launches at least that many blocks after a quiet stretch.
        starts, i = [], first
        while i < last:
            if ctas[i] + ctas[i - 1] >= a.layer_ctas and (not starts or i - starts[-1] > 10):
                starts.append(i if ctas[i] >= ctas[i - 1] else i - 1)
                i += 10
            i += 1
        starts = starts[:: a.every]
        period = a.period or min(b - s for s, b in zip(starts, starts[1:]))
        # Only layers another start follows (the last start may be the LM head's).
        full = [s for s, b in zip(starts, starts[1:]) if s + period <= b]
        print(f"{len(starts)} starts, profile of {len(full)} layers over {period} samples:")
        for k in range(period):
            d = sum(dram[s + k] for s in full) / len(full)
            c = sum(ctas[s + k] for s in full) / len(full)
            print(f"  +{k * dt:5.1f} us  dram {d:5.1f}%  ctas {c:6.1f}  {'#' * int(d / 4)}")


if __name__ == "__main__":
    main()
