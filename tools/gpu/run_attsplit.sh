#!/usr/bin/env bash
# Issue 18, the chunked attention's decode grid (k_att_scores over head groups of ATT_SHG; every kernel's loads of a
# slice in flight together), in one device call. Stage first:
#   tools/gpu/stage.sh && tools/gpu/stage_variant.sh dsv4-hg64 "-DATT_SHG=64 -DATT_SDS=64"
#   (optional: .gpu/dsv4-base, the binary of the commit before, for the three-way A/B)
# then `run` with carry [".gpu"]: bash tools/gpu/run_attsplit.sh
#   1. test_gpu_attention (its decode shapes: steps of 1-4 queries = alone, memcmp, and the double reference);
#   2. decode at a 256-token prompt (Flash, OFFICIAL), two rounds alternating: dsv4 (16 heads a scores block),
#      dsv4-hg64 (64: the grid before, with the new loads), dsv4-base if staged; the same with DSV4_CUDA_ATT_MMA=1;
#      prefill of 8192 once each;
#   3. ncu over one decode step's k_att_* launches, dsv4 and dsv4-hg64 (time, grid, registers, warps active).
# Lines that matter last.
. tools/gpu/env.sh
BINS="dsv4 dsv4-hg64"
[ -x .gpu/dsv4-base ] && BINS="$BINS dsv4-base"
timeout 180 .gpu/gputests/test_gpu_attention >"$OUT/attention.log" 2>&1
echo "test_gpu_attention exit $? at $(el) s" >>"$OUT/attention.log"
for r in 1 2; do for b in $BINS; do
  echo "== $b round $r" >>"$OUT/ab.log"
  timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 --no-bandwidth >>"$OUT/ab.log" 2>&1
  echo "== $b round $r ATT_MMA=1" >>"$OUT/ab.log"
  DSV4_CUDA_ATT_MMA=1 timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 --no-bandwidth >>"$OUT/ab.log" 2>&1
done; done
for b in $BINS; do
  echo "== $b prefill 8192" >>"$OUT/prefill.log"
  timeout 120 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 8192 --decode 2 --no-bandwidth >>"$OUT/prefill.log" 2>&1
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
for b in dsv4 dsv4-hg64; do
  timeout 200 "$NCU" --clock-control none --metrics "$M" --csv --page raw --kernel-name "regex:^k_att_" --launch-count 400 \
      .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 2 --no-bandwidth >"$OUT/ncu-$b.csv" 2>"$OUT/ncu-$b.err"
  echo "ncu $b exit $?" >>"$OUT/ncu-$b.err"
done
echo "== test_gpu_attention:"; grep -E "keys|OK|FAIL|PASSED|rror|exit" "$OUT/attention.log" | cut -c1-160
echo "== decode A/B:"; grep -E "==|decode, 1|rror" "$OUT/ab.log"
echo "== prefill:"; grep -E "==|prefill|rror" "$OUT/prefill.log"
for b in dsv4 dsv4-hg64; do
  echo "== ncu $b (k_att_* by kernel and grid):"
  python3 - "$OUT/ncu-$b.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
if len(rows) < 3: print("  no rows"); sys.exit()
h = rows[0]; data = rows[2:]
k = h.index("Kernel Name"); t = h.index("gpu__time_duration.sum"); g = h.index("launch__grid_size")
bs = h.index("launch__block_size"); rg = h.index("launch__registers_per_thread")
unit = rows[1][t]
agg = collections.defaultdict(list)   # by (kernel, grid, block): the prefill's launches have the large grids
for r in data:
    try: agg[(r[k].split("(")[0], int(r[g].replace(",", "")), r[bs], r[rg])].append(float(r[t].replace(",", "")))
    except ValueError: pass
for (name, grid, block, regs), ts in sorted(agg.items()):
    print("  %-34s grid %7d block %4s regs %4s: %4d launches, mean %9.1f %s (min %.1f, max %.1f)" % (name[:34], grid, block, regs, len(ts), sum(ts) / len(ts), unit, min(ts), max(ts)))
PY
done
