#!/usr/bin/env bash
# One device call (~3 minutes; stage with tools/gpu/stage.sh, carry [".gpu"]): the tensor-core linears in the model.
#   1. the GPU suite (OFFICIAL tests now run the FP8 tensor-core path; test_gpu_vs_cpu prints the calmpro statistics);
#   2. Flash, OFFICIAL, graphs on: DSV4_CUDA_MMA=1 against =0, prompt 256 + decode, two rounds; then prefill of a
#      4096-token prompt with each.
. tools/gpu/env.sh
BUILD=.gpu VERBOSE=1 timeout 240 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
for r in 1 2; do for v in 1 0; do
  echo "== DSV4_CUDA_MMA=$v round $r" >>"$OUT/ab.log"
  DSV4_CUDA_MMA=$v timeout 90 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 --no-bandwidth >>"$OUT/ab.log" 2>&1
  echo "exit $? at $(el) s" >>"$OUT/ab.log"
done; done
for v in 1 0; do
  echo "== DSV4_CUDA_MMA=$v prompt 4096" >>"$OUT/ab.log"
  DSV4_CUDA_MMA=$v timeout 120 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 4096 --decode 4 --no-bandwidth >>"$OUT/ab.log" 2>&1
  echo "exit $? at $(el) s" >>"$OUT/ab.log"
done
echo "== suite:"; grep -E "^FAIL|FAIL|passed, .* failed|suite exit|calmpro|GPU OFFICIAL|dlogit" "$OUT/suite.log" | tail -14
echo "== A/B:"; grep -E "^==|prefill|decode, 1|speculative|rror|exit" "$OUT/ab.log"
echo "total $(el) s"
