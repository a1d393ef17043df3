#!/usr/bin/env bash
# One device call (session 2026-12-02; stage with tools/gpu/stage.sh and tools/gpu/fuzz_stage.sh; carry [".gpu", ".fuzz"]):
#   0. fuzzing in the background on FUZZ_CORES (13) cores for FUZZ_SECONDS (issue 14), stopped at the end;
#   1. the GPU suite (with the K >= 1024 tensor-core row of the parity matrix and its cli check);
#   2. where a decode step's time goes now: Nsight Compute over one Flash step (one token), caches NOT flushed
#      between kernels (--cache-control none: a real step keeps x and small weights in L2), time per kernel;
#   3. bench --profile: per-stage times of a 8192-token prefill and of decode at prompt 256.
. tools/gpu/env.sh
if [ -n "${FUZZ_SECONDS:-}" ]; then OUT="$OUT" FUZZ_TARGETS="${FUZZ_TARGETS:-}" tools/gpu/fuzz_bg.sh start "$FUZZ_SECONDS" "${FUZZ_CORES:-13}"; fi
BUILD=.gpu VERBOSE=1 timeout 240 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
timeout 200 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    --csv --page raw --kernel-name "regex:^k_([^f]|f[^i])" --launch-count 3000 \
    .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 1 --decode 1 --no-bandwidth >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
echo "ncu exit $? at $(el) s" >>"$OUT/ncu.err"
python3 tools/gpu/ncu_summary.py "$OUT/ncu.csv" k_embed 1 >"$OUT/ncu_summary.txt" 2>&1
timeout 120 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 8192 --decode 2 --no-bandwidth --profile >"$OUT/prefill_profile.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/prefill_profile.log"
timeout 60 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 --no-bandwidth --profile >"$OUT/decode_profile.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/decode_profile.log"
timeout 60 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 >"$OUT/decode.log" 2>&1
echo "== suite:"; grep -E "FAIL|passed, .* failed|suite exit|K >= 1024" "$OUT/suite.log" | tail -12
echo "== ncu:"; tail -3 "$OUT/ncu.err"; head -40 "$OUT/ncu_summary.txt"
echo "== prefill 8K profile:"; grep -E "ms|prefill|exit|rror" "$OUT/prefill_profile.log" | head -30
echo "== decode profile:"; grep -E "ms|decode|exit|rror" "$OUT/decode_profile.log" | head -30
echo "== decode:"; grep -E "bandwidth|decode|fraction|verify" "$OUT/decode.log"
if [ -n "${FUZZ_SECONDS:-}" ]; then echo "== fuzz:"; OUT="$OUT" tools/gpu/fuzz_bg.sh stop | tail -16; fi
echo "total $(el) s"
