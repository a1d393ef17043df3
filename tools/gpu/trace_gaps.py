#!/usr/bin/env python3
"""Where a split step's time goes between two hand-offs to the host (issue 15), from the kernel records of
`dsv4 bench --kernel-trace --json FILE` (kernel_trace.records: [name, start, end] in ns, by start).

For each decode step (the traced decode steps begin at k_embed; the 9th traced step is the verify step) a layer's
cycle is cut at two marks:
  routed   the end of the layer's router (k_route_plan, else k_route_fast / k_route): its routing exists;
  answered the end of the hand-off back: k_hx_await_rows (enqueued ahead: its time includes the GPU's wait for the
           host) or k_scatter_pair_rows (launched directly: it runs once the host's rows were copied).
Then
  host turn   routed(L) -> answered(L): the host's experts as the GPU sees them (plus, ahead, the await's own reads);
  GPU stretch answered(L) -> routed(L + 1): the experts' sum, mHC, the next attention, the router — the part the
              host waits for. Its kernels' union time and its idle time (no kernel running) are printed, and its
              kernels by time, so that two runs (directly / ahead / ahead with graphs off) compare kernel by kernel.

usage: trace_gaps.py FILE.json [FILE2.json ...]"""
import json
import sys

ROUTERS = ("k_route_plan", "k_route_fast", "k_route")
ANSWERS = ("k_hx_await_rows", "k_scatter_pair_rows")


def steps_of(records):
    steps, cur = [], None
    for r in records:
        if r[0] == "k_embed":
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append(r)
    return steps


def union_ns(spans):
    busy, end = 0, None
    for _, s, e in sorted(spans, key=lambda r: r[1]):
        a = s if end is None or s > end else end
        if e > a:
            busy += e - a
        end = e if end is None or e > end else end
    return busy


def analyse(path):
    with open(path) as f:
        rep = json.load(f)
    recs = rep.get("kernel_trace", {}).get("records")
    if not recs:
        print(f"{path}: no kernel_trace.records (run the bench with --kernel-trace --json)")
        return
    steps = steps_of(recs)[:8]   # the decode steps; the 9th is the verify step
    turns, stretches, busy, kernels = [], [], [], {}
    for st in steps:
        routed = [r for r in st if r[0] in ROUTERS]
        answered = [r for r in st if r[0] in ANSWERS]
        for i, a in enumerate(answered):
            # this layer's routing: the last router that ended before the answer began
            before = [r for r in routed if r[2] <= a[1]]
            if before:
                turns.append(a[2] - before[-1][2])
            after = [r for r in routed if r[2] >= a[2]]
            if not after:
                continue
            nxt = after[0]
            inside = [r for r in st if r[1] >= a[2] and r[2] <= nxt[2]]
            stretches.append(nxt[2] - a[2])
            busy.append(union_ns(inside))
            for r in inside:
                k = kernels.setdefault(r[0], [0, 0])
                k[0] += 1
                k[1] += r[2] - r[1]
    n = len(stretches)
    if not n:
        print(f"{path}: no hand-offs found in {len(steps)} steps")
        return
    mean = lambda xs: sum(xs) / len(xs) / 1e3
    print(f"{path}: {len(steps)} decode steps, {n} GPU stretches")
    print(f"  host turn (routed -> answered)  {mean(turns):8.1f} us a layer")
    print(f"  GPU stretch (answered -> routed) {mean(stretches):8.1f} us a layer: kernels running {mean(busy):.1f} us, "
          f"none {mean(stretches) - mean(busy):.1f} us")
    for name, (cnt, ns) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:16]:
        print(f"    {name:34s} {cnt / n:5.2f} a stretch x {ns / cnt / 1e3:7.2f} us = {ns / n / 1e3:7.1f} us")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        analyse(p)
