#!/usr/bin/env bash
# On the lent GPU machine (stage first with tools/gpu/stage.sh, then `run` with carry [".gpu"]), CUDA graphs (issue 18):
#   1. tests/gpu/test_gpu_graphs alone, verbose (graphs on against off, memcmp; a graph missing a kernel must differ);
#   2. the GPU suite (every other GPU test now runs its steps as graphs);
#   3. Flash (OFFICIAL, prompt 256): decode at 1 stream and at 8 streams, the verify step, with DSV4_CUDA_GRAPHS=1
#      and =0, alternating, ROUNDS rounds (default 1; a round is two bench runs of about a minute each).
# Logs under $OUT; the lines that matter last.
. tools/gpu/env.sh
timeout 120 .gpu/gputests/test_gpu_graphs >"$OUT/graphs.log" 2>&1
echo "test_gpu_graphs exit $? at $(el) s" >>"$OUT/graphs.log"
BUILD=.gpu VERBOSE=1 timeout "${SUITE_SECONDS:-240}" tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
for r in $(seq 1 "${ROUNDS:-1}"); do for g in 1 0; do
  echo "== DSV4_CUDA_GRAPHS=$g round $r" >>"$OUT/ab.log"
  DSV4_CUDA_GRAPHS=$g timeout 100 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 \
      --streams 8 --no-bandwidth >>"$OUT/ab.log" 2>&1
  echo "exit $? at $(el) s" >>"$OUT/ab.log"
done; done
echo "== test_gpu_graphs:"; tail -12 "$OUT/graphs.log"
echo "== suite:"; grep -E "^FAIL|passed, .* failed|suite exit" "$OUT/suite.log" | tail -6
echo "== A/B:"; grep -E "^==|CUDA graphs|prefill|decode, 1|speculative|^ +8 |rror|exit" "$OUT/ab.log"
