#!/usr/bin/env bash
# The indexer's scoring kernels on the device (issue 18, session 2026-12-06d): test_gpu_indexer's timing tests for
# each staged build of it (.gpu/tidx-*.tar.xz: tidx-base and variants from tools/gpu/stage_variant.sh with
# TARGET=gputests/test_gpu_indexer), the whole program once, ncu's sections of one prefill launch of each scoring
# kernel, then tools/gpu/run_s7.sh's parts in PARTS (e.g. long with LONG_RUNS). IDX_ROUNDS: rounds of the timings.
. tools/gpu/env.sh
L=/tmp/run-logs-idx && rm -rf $L && mkdir -p $L
[ -f .gpu/tidx.tar.xz ] && tar -C .gpu -xJf .gpu/tidx.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
for r in $(seq 1 ${IDX_ROUNDS:-2}); do
  for b in .gpu/tidx-*; do
    case $b in *.xz) continue ;; esac
    IDX_TEST_ONLY="timing_*" $b >$L/time_$(basename $b)_$r.log 2>&1
    echo "== $(basename $b) round $r: $(grep -E 'one query over|prefill launch' $L/time_$(basename $b)_$r.log | sed -E 's/ \(64 x 128[^)]*\)//' | tr -s ' ' | tr '\n' ';')"
  done
done
.gpu/tidx-base >$L/all.log 2>&1; echo "== test_gpu_indexer (tidx-base): exit $?, $(grep -E 'PASSED|FAILED' $L/all.log | tr '\n' ' ')"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
for k in k_index_score_mma k_index_score_tiles; do
  IDX_TEST_ONLY=timing_prefill_chunk timeout 120 "$NCU" --clock-control none --kernel-name "regex:^$k" --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --section InstructionStats --section MemoryWorkloadAnalysis .gpu/tidx-base >>"$OUT/ncu_idx.txt" 2>&1
done
echo "== ncu: $(grep -c 'Duration' "$OUT/ncu_idx.txt") launches"
grep -E "^  k_index|Duration|Executed Ipc A|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Executed Instructions  " "$OUT/ncu_idx.txt" | tr -s ' '
tar -C /tmp -czf "$OUT/idx_logs.tgz" run-logs-idx
[ -n "${PARTS:-}" ] && bash tools/gpu/run_s7.sh
exit 0
