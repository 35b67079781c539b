import re, sys, collections
tot = collections.OrderedDict(); name = None; cur = {}
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    m = re.match(r"\s\s(\S+) \((\d+), (\d+), (\d+)\)x", line)
    if m: name = m.group(1) + " grid(%s,%s,%s)" % m.groups()[1:]; continue
    m = re.search(r"(gpu__time_duration.sum|dram__throughput.avg.pct_of_peak_sustained_elapsed|dram__bytes_read.sum)\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(3).replace(",", ""))
        u = m.group(2)
        v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3, "byte": 1e-6}.get(u, 1)
        rows[name][m.group(1)].append(v)
all_us = sum(sum(r["gpu__time_duration.sum"]) for r in rows.values())
for k, r in sorted(rows.items(), key=lambda kv: -sum(kv[1]["gpu__time_duration.sum"])):
    t = r["gpu__time_duration.sum"]; d = r["dram__throughput.avg.pct_of_peak_sustained_elapsed"]; b = r["dram__bytes_read.sum"]
    print("%10.1f us %5.1f%% x%-4d avg %7.2f us  dram %5.1f%%  read %7.2f MB  %s" % (sum(t), 100*sum(t)/all_us, len(t), sum(t)/len(t), sum(d)/max(len(d),1), sum(b)/max(len(b),1), k))
print("%10.1f us total" % all_us)
