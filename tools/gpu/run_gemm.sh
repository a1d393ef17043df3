#!/usr/bin/env bash
# On the lent GPU machine (repository root, .gpu/ carried after tools/gpu/stage.sh and tools/gpu/stage_gemm_bug.sh):
# the large-T tensor-core linear (src/backend/cuda/k_mma_gemm.cu) — its test (memcmp against k_mma.cu's small tiles),
# the deliberately broken builds (must fail), memcheck over the test, its benchmark (k_mma vs GEMM TFLOPS at the
# V4-Flash shapes), test_gpu_mma (the small tiles still exact; its bench now times the GEMM from T = 512), the 8K
# prefill and a 256-stream decode with the GEMM on and off (DSV4_CUDA_GEMM). Logs under $OUT.
. tools/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader >"$OUT/gpu.txt" 2>&1
.gpu/gputests/test_gpu_gemm >"$OUT/gemm_test.log" 2>&1
echo "test_gpu_gemm rc=$? at $(el) s" | tee -a "$OUT/gemm_test.log"
for n in 1 2; do
  if [ -x ".gpu/test_gpu_gemm-bug$n" ]; then
    ".gpu/test_gpu_gemm-bug$n" >"$OUT/gemm_bug$n.log" 2>&1
    echo "test_gpu_gemm-bug$n (-DDSV4_GEMM_BUG=$n) rc=$? (must not be 0) at $(el) s" | tee -a "$OUT/gemm_bug$n.log"
  fi
done
.gpu/gputests/test_gpu_gemm --bench >"$OUT/gemm_bench.log" 2>&1
echo "test_gpu_gemm --bench rc=$? at $(el) s" | tee -a "$OUT/gemm_bench.log"
.gpu/gputests/test_gpu_mma >"$OUT/mma_test.log" 2>&1
echo "test_gpu_mma rc=$? at $(el) s" | tee -a "$OUT/mma_test.log"
for g in 1 0; do
  DSV4_CUDA_GEMM=$g .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 8192 --decode 2 --no-bandwidth --profile \
      >"$OUT/prefill_gemm$g.log" 2>&1
  echo "bench prefill 8192 DSV4_CUDA_GEMM=$g rc=$? at $(el) s" | tee -a "$OUT/prefill_gemm$g.log"
done
# a 256-stream decode step is T = 256: the plain linears take the GEMM there (CU_MMA_GEMM_MIN_T), with a grid
# of only 2 token tiles; this shows whether that threshold costs the batched decode anything
for g in 1 0; do
  DSV4_CUDA_GEMM=$g timeout 200 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 64 --decode 16 --streams 256 \
      --no-bandwidth >"$OUT/streams256_gemm$g.log" 2>&1
  echo "bench 256 streams DSV4_CUDA_GEMM=$g rc=$? at $(el) s" | tee -a "$OUT/streams256_gemm$g.log"
done
if [ "${GEMM_MEMCHECK_SECONDS:-120}" != 0 ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout "${GEMM_MEMCHECK_SECONDS:-120}" "$CS" --tool memcheck --error-exitcode 9 .gpu/gputests/test_gpu_gemm >"$OUT/gemm_memcheck.log" 2>&1
  echo "memcheck test_gpu_gemm rc=$? (124: timed out) at $(el) s" | tee -a "$OUT/gemm_memcheck.log"
  timeout "${GEMM_MEMCHECK_SECONDS:-120}" "$CS" --tool racecheck --error-exitcode 9 .gpu/gputests/test_gpu_gemm >"$OUT/gemm_racecheck.log" 2>&1
  echo "racecheck test_gpu_gemm rc=$? (124: timed out) at $(el) s" | tee -a "$OUT/gemm_racecheck.log"
fi
tail -n 20 "$OUT/gemm_test.log"
cat "$OUT/gemm_bench.log"
grep -h -i "prefill" "$OUT"/prefill_gemm*.log
grep -h -i "streams\|tok/s" "$OUT"/streams256_gemm*.log
