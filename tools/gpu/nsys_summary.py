#!/usr/bin/env python3
"""Summarise tools/gpu/nsys_step.sh's trace: the kernels of an Nsight Systems SQLite export (CUPTI kernel records,
graph nodes included), cut into steps at each launch of the first kernel of a step (k_embed). Step 0 is the prefill,
steps 1 .. D the bench's decode steps, then its verify steps (6 tokens). For the decode steps after the first two
(graph capture) and for the verify steps: a step's span (first kernel start to last kernel end), the time at least
one kernel ran (the union of their intervals: branches overlap), the rest (no kernel running: the chain's launch
gaps), and the kernels by mean time a step. Usage: nsys_summary.py trace.sqlite [first-kernel [D]]"""
import collections, sqlite3, sys

db = sqlite3.connect(sys.argv[1])
first = sys.argv[2] if len(sys.argv) > 2 else "k_embed"
D = int(sys.argv[3]) if len(sys.argv) > 3 else 16
cols = [r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
name_col = "shortName" if "shortName" in cols else "demangledName"
rows = db.execute(f"SELECT k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON k.{name_col} = s.id "
                  "ORDER BY k.start").fetchall()
rows = [(a, b, n.split("(")[0].split("<")[0]) for a, b, n in rows if not n.startswith("k_fill")]
starts = [i for i, r in enumerate(rows) if r[2] == first]
print(f"{len(rows)} kernels traced; {len(starts)} steps (each from a launch of {first})")
bounds = starts + [len(rows)]
steps = [rows[bounds[k]:bounds[k + 1]] for k in range(len(starts))]


def busy_ns(ks):
    t, end = 0, None
    for a, b, _ in sorted(ks):
        if end is None or a >= end:
            t += b - a
            end = b
        elif b > end:
            t += b - end
            end = b
    return t


def report(label, group):
    if not group:
        print(f"\n{label}: no such steps")
        return
    n = len(group)
    span = sum(s[-1][1] - s[0][0] for s in group) / n
    busy = sum(busy_ns(s) for s in group) / n
    launches = sum(len(s) for s in group) / n
    print(f"\n{label}: {n} steps, {launches:.0f} kernels a step; span {span / 1e3:.1f} us, some kernel running "
          f"{busy / 1e3:.1f} us ({100 * busy / span:.1f} %), none {(span - busy) / 1e3:.1f} us "
          f"({(span - busy) / launches / 1e3:.2f} us a kernel)")
    agg = collections.OrderedDict()
    for s in group:
        for a, b, name in s:
            x = agg.setdefault(name, [0, 0])
            x[0] += 1
            x[1] += b - a
    tot = sum(x[1] for x in agg.values())
    print(f"{'kernel':34s} {'n/step':>7s} {'us/step':>9s} {'%':>5s} {'us each':>8s}")
    for name, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:int(sys.argv[4]) if len(sys.argv) > 4 else 30]:
        print(f"{name[:34]:34s} {c / n:7.1f} {t / n / 1e3:9.1f} {100 * t / tot:5.1f} {t / c / 1e3:8.2f}")


report("decode steps 3..%d" % D, steps[3:D + 1])
report("verify steps", steps[D + 1:])
