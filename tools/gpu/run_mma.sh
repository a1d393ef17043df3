#!/usr/bin/env bash
# On the lent GPU machine (repository root, .gpu/ carried after tools/gpu/stage.sh): the tensor-core linear
# (src/backend/cuda/k_mma.cu) — its test, its benchmark, memcheck over the test, and, when .gpu/test_gpu_mma-bug
# was staged (tools/gpu/stage_mma_bug.sh), the deliberately broken build, which must fail. Logs under $OUT.
. tools/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader >"$OUT/gpu.txt" 2>&1
.gpu/gputests/test_gpu_mma >"$OUT/mma_test.log" 2>&1
echo "test_gpu_mma rc=$? at $(el) s" | tee -a "$OUT/mma_test.log"
.gpu/gputests/test_gpu_mma --bench >"$OUT/mma_bench.log" 2>&1
echo "test_gpu_mma --bench rc=$? at $(el) s" | tee -a "$OUT/mma_bench.log"
if [ -x .gpu/test_gpu_mma-bug ]; then
  .gpu/test_gpu_mma-bug >"$OUT/mma_bug.log" 2>&1
  echo "test_gpu_mma-bug (-DDSV4_MMA_BUG) rc=$? (must not be 0) at $(el) s" | tee -a "$OUT/mma_bug.log"
fi
# memcheck over the test (MMA_MEMCHECK_SECONDS=0 skips it)
if [ "${MMA_MEMCHECK_SECONDS:-180}" != 0 ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout "${MMA_MEMCHECK_SECONDS:-180}" "$CS" --tool memcheck --error-exitcode 9 .gpu/gputests/test_gpu_mma >"$OUT/mma_memcheck.log" 2>&1
  echo "memcheck test_gpu_mma rc=$? (124: timed out) at $(el) s" | tee -a "$OUT/mma_memcheck.log"
fi
tail -n 30 "$OUT/mma_test.log"
cat "$OUT/mma_bench.log"
