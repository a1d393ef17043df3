#!/usr/bin/env python3
"""Sum ncu's gpu__time_duration.sum per kernel name and grid from `ncu --csv --page raw` output (the profiled
program's own lines before the CSV header are skipped). Usage: ncu_kernel_sum.py FILE.csv"""
import collections
import csv
import sys

rows = [r for r in csv.reader(open(sys.argv[1])) if r]
i0 = next(i for i, r in enumerate(rows) if r[0] == "ID")
head = rows[i0]
name, dur, grid = head.index("Kernel Name"), head.index("gpu__time_duration.sum"), head.index("Grid Size")
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}.get(rows[i0 + 1][dur], 1e-6)
by_name, by_grid, n_name, n_grid = (collections.defaultdict(float), collections.defaultdict(float),
                                    collections.Counter(), collections.Counter())
for r in rows[i0 + 2:]:
    if len(r) != len(head):
        continue
    try:
        ms = float(r[dur].replace(",", "")) * scale
    except ValueError:
        continue
    k = r[name].split("(")[0].split("<")[0].replace("void ", "")
    by_name[k] += ms
    n_name[k] += 1
    by_grid[(k, r[grid])] += ms
    n_grid[(k, r[grid])] += 1
print(f"{'kernel':26s} {'launches':>8s} {'ms':>10s}")
for k in sorted(by_name, key=lambda k: -by_name[k]):
    print(f"{k:26s} {n_name[k]:8d} {by_name[k]:10.2f}")
print(f"{'total':26s} {sum(n_name.values()):8d} {sum(by_name.values()):10.2f}\n\nthe largest (kernel, grid) groups:")
for k in sorted(by_grid, key=lambda k: -by_grid[k])[:16]:
    print(f"{k[0]:22s} {k[1]:16s} {n_grid[k]:6d} {by_grid[k]:9.2f} ms {1e3 * by_grid[k] / n_grid[k]:8.1f} us a launch")
