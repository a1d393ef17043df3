#!/usr/bin/env bash
# On the lent GPU machine (.gpu/ carried): Nsight Compute over every kernel of a short `bench --synthetic flash`
# run (a first step of one token; the fills of the synthetic weights and the load's packing kernels are not profiled), a few counters per launch, one CSV row per launch
# ($OUT/ncu.csv), summarised by tools/gpu/ncu_summary.py. --clock-control none: the card's clocks are left alone.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread
M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__inst_executed.sum,launch__waves_per_multiprocessor
M=${NCU_METRICS:-$M}   # fewer counters, fewer replay passes
timeout "${NCU_SECONDS:-400}" "$NCU" --clock-control none --metrics "$M" --csv --page raw --kernel-name "regex:^k_(?!fill|mma_frag_pack|nat_pack)" --launch-count "${NCU_LAUNCHES:-2400}" \
    .gpu/${BIN:-dsv4} bench --synthetic ${MODEL:-flash} --device cuda --mode official --prompt 1 --decode 2 --no-bandwidth \
    >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
echo "ncu exit $?"; tail -3 "$OUT/ncu.err"; wc -l "$OUT/ncu.csv"
python3 tools/gpu/ncu_summary.py "$OUT/ncu.csv" k_embed 0
