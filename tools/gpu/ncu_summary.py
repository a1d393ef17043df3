#!/usr/bin/env python3
"""Summarise tools/gpu/ncu_step.sh's CSV: the launches of the last single-token decode step (the launches after
a step starts at each launch of the embedding kernel; step 2 = the second decode step by default), grouped by kernel: launches, time, DRAM bytes read,
GB/s, registers, achieved occupancy, waves. Usage: ncu_summary.py ncu.csv [first-kernel-of-a-step [step]]; step "all":
every launch in the file (a CSV of chosen kernels over a whole run, e.g. run_s7.sh's ncuatt). Metrics the CSV lacks
count as 0."""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr_i = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
hdr = rows[hdr_i]; data = [r for r in rows[hdr_i + 2:] if len(r) == len(hdr)]
col = {h: i for i, h in enumerate(hdr)}
def f(r, k):
    try: return float(r[col[k]].replace(",", ""))
    except (ValueError, KeyError): return 0.0
first = sys.argv[2] if len(sys.argv) > 2 else "k_embed"
starts = [i for i, r in enumerate(data) if first in r[col["Kernel Name"]]]
print(f"{len(data)} launches profiled; steps start at {starts[:8]}")
if len(sys.argv) > 3 and sys.argv[3] == "all":
    lo, hi = 0, len(data)
else:
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 2     # step 0 is the prefill; 1.. the decode steps
    bounds = starts + [len(data)]
    lo, hi = bounds[min(k, len(starts) - 1)], bounds[min(k, len(starts) - 1) + 1]
step = data[lo:hi]
agg = collections.OrderedDict()
for r in step:
    name = r[col["Kernel Name"]].split("(")[0].split("<")[0]
    a = agg.setdefault(name, [0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    t = f(r, "gpu__time_duration.sum")   # ns
    a[0] += 1; a[1] += t; a[2] += f(r, "dram__bytes_read.sum"); a[3] = f(r, "launch__registers_per_thread")
    a[4] += f(r, "sm__warps_active.avg.pct_of_peak_sustained_active") * t; a[5] += f(r, "launch__waves_per_multiprocessor") * t
    a[6] += f(r, "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio") * t
tot = max(1e-9, sum(a[1] for a in agg.values())) if agg else 1e-9
_unused = sum(a[1] for a in agg.values()); totb = sum(a[2] for a in agg.values())
print(f"step = launches {lo}..{hi}: {len(step)} launches, {tot/1e3:.1f} us of kernel time, {totb/1e9:.3f} GB read from DRAM "
      f"= {totb/tot:.1f} GB/s (units: ncu's)")
print(f"{'kernel':32s} {'n':>5s} {'us':>9s} {'%':>5s} {'MB':>8s} {'GB/s':>7s} {'regs':>4s} {'occ%':>5s} {'waves':>6s} {'lsb':>5s}")
for name, a in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{name[:32]:32s} {a[0]:5d} {a[1]/1e3:9.1f} {100*a[1]/tot:5.1f} {a[2]/1e6:8.1f} {a[2]/max(a[1],1):7.1f} "
          f"{a[3]:4.0f} {a[4]/max(a[1],1):5.1f} {a[5]/max(a[1],1):6.2f} {a[6]/max(a[1],1):5.1f}")
# the same launches by kernel and grid (matrix shapes show as grid sizes), the 14 costliest
shp = collections.OrderedDict()
for r in step:
    key = (r[col["Kernel Name"]].split("(")[0].split("<")[0], int(f(r, "launch__grid_size")), int(f(r, "launch__block_size")))
    a = shp.setdefault(key, [0, 0.0, 0.0]); a[0] += 1; a[1] += f(r, "gpu__time_duration.sum"); a[2] += f(r, "dram__bytes_read.sum")
print(f"\n{'kernel':32s} {'grid':>7s} {'block':>5s} {'n':>5s} {'us':>9s} {'us each':>8s} {'MB each':>8s} {'GB/s':>7s}")
for (name, g, b), a in sorted(shp.items(), key=lambda kv: -kv[1][1])[:14]:
    print(f"{name[:32]:32s} {g:7d} {b:5d} {a[0]:5d} {a[1]/1e3:9.1f} {a[1]/1e3/a[0]:8.1f} {a[2]/1e6/a[0]:8.2f} {a[2]/max(a[1],1):7.1f}")
