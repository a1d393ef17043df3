#!/usr/bin/env bash
# One device call (~4 minutes): stage with NVFLAGS="... -DLIN_PIPE=1" bash tools/gpu/stage.sh, then
# tools/gpu/stage_variant.sh dsv4-old "-DLIN_PIPE=0"; `run` with carry [".gpu"].
#   1. test_gpu_graphs alone (graphs on against off, memcmp; a graph missing a kernel must differ);
#   2. the GPU suite (built with LIN_PIPE=1; every test's steps run as graphs);
#   3. Flash decode (OFFICIAL, prompt 256), three binaries/settings alternating, two rounds:
#      dsv4 (LIN_PIPE 1, graphs), dsv4 with DSV4_CUDA_GRAPHS=0, dsv4-old (LIN_PIPE 0, graphs);
#   2b. the tensor-core linear's benchmark (test_gpu_mma --bench; its test is in the suite);
#   4. decode after 4K and 128K contexts (fp8 KV), no profiler.
. tools/gpu/env.sh
timeout 120 .gpu/gputests/test_gpu_graphs >"$OUT/graphs.log" 2>&1
echo "test_gpu_graphs exit $? at $(el) s" >>"$OUT/graphs.log"
BUILD=.gpu VERBOSE=1 timeout 240 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
timeout 100 .gpu/gputests/test_gpu_mma --bench >"$OUT/mma_bench.log" 2>&1
echo "test_gpu_mma --bench exit $? at $(el) s" >>"$OUT/mma_bench.log"
for r in 1 2; do for v in "dsv4 1" "dsv4 0" "dsv4-old 1"; do
  set -- $v
  echo "== $1 graphs=$2 round $r" >>"$OUT/ab.log"
  DSV4_CUDA_GRAPHS=$2 timeout 90 .gpu/$1 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 --no-bandwidth >>"$OUT/ab.log" 2>&1
  echo "exit $? at $(el) s" >>"$OUT/ab.log"
done; done
timeout 120 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 --no-bandwidth \
    --context 4096,131072 >"$OUT/context.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/context.log"
echo "== test_gpu_graphs:"; tail -8 "$OUT/graphs.log"
echo "== suite:"; grep -E "^FAIL|passed, .* failed|suite exit" "$OUT/suite.log" | tail -6
echo "== A/B:"; grep -E "^==|CUDA graphs|prefill|decode, 1|speculative|rror|exit" "$OUT/ab.log"
echo "== context:"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+|rror|exit" "$OUT/context.log"
echo "== mma bench:"; tail -40 "$OUT/mma_bench.log"
echo "total $(el) s"
