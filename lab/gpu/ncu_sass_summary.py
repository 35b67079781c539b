#!/usr/bin/env python3
"""Where a kernel's warps stall, from ncu's source page exported as CSV
(`ncu -i REPORT --page source --print-source sass --csv > FILE`): per kernel, the stall
reasons summed over all instructions, then the samples, instructions executed and top opcodes
of each 2 KiB of code (the regions of a kernel: prologue, staging, math, merge, epilogue).

    lab/gpu/ncu_sass_summary.py FILE.csv [--bin 2048] [--min-samples 20] [--top N]

--top N adds the N instructions with the most samples, with their stall reasons.
"""
import argparse
import collections
import csv


def kernels(path):
    """(name, [row dict]) per kernel section of the CSV, in order."""
    name, header, rows = None, None, []
    for r in csv.reader(open(path, newline="")):
        if not r:
            continue
        if r[0] == "Kernel Name":
            if name is not None:
                yield name, rows
            name, header, rows = r[1], None, []
        elif r[0] == "Address":
            header = r
        elif header:
            rows.append(dict(zip(header, r)))
    if name is not None:
        yield name, rows


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@") and len(words) > 1:
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--bin", type=lambda s: int(s, 0), default=2048)
    ap.add_argument("--min-samples", type=int, default=20)
    ap.add_argument("--top", type=int, default=0)
    a = ap.parse_args()
    num = lambda row, key: int(row.get(key) or 0)
    for name, rows in kernels(a.csv):
        stalls = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
        samples = sum(num(r, "Warp Stall Sampling (All Samples)") for r in rows)
        executed = sum(num(r, "Instructions Executed") for r in rows)
        print(f"== {name}: {len(rows)} instructions, {executed} executed, {samples} samples")
        totals = collections.Counter({s[6:]: sum(num(r, s) for r in rows) for s in stalls})
        print("   stalls:", ", ".join(f"{k} {v}" for k, v in totals.most_common(8)))
        base = int(rows[0]["Address"], 16)
        bins = collections.OrderedDict()
        for r in rows:
            b = bins.setdefault((int(r["Address"], 16) - base) // a.bin,
                                [0, 0, collections.Counter(), collections.Counter()])
            b[0] += num(r, "Warp Stall Sampling (All Samples)")
            b[1] += num(r, "Instructions Executed")
            b[2][opcode(r["Source"])] += num(r, "Instructions Executed")
            for s in stalls:
                b[3][s[6:]] += num(r, s)
        for k, (s, n, ops, st) in bins.items():
            if s >= a.min_samples:
                top = " ".join(f"{o}:{c}" for o, c in ops.most_common(4))
                why = " ".join(f"{o}:{c}" for o, c in st.most_common(3))
                print(f"   +{k * a.bin:#07x} {s:6d} samples {n:9d} executed | {top} | {why}")
        hot = sorted(rows, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[: a.top]
        for r in hot:
            why = collections.Counter({s[6:]: num(r, s) for s in stalls})
            reasons = " ".join(f"{o}:{c}" for o, c in why.most_common(3) if c)
            print(f"   {int(r['Address'], 16) - base:#07x} "
                  f"{num(r, 'Warp Stall Sampling (All Samples)'):6d} {r['Source'][:60]:<60} {reasons}")


if __name__ == "__main__":
    main()
