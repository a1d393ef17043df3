#!/usr/bin/env bash
# On the lent GPU machine (repository root, .gpu/ carried after tools/gpu/stage.sh; the test programs unpacked as
# tools/gpu/run.sh does): the BF16-input tensor-core linear (src/backend/cuda/k_mma16.cu) — its test, its benchmark
# at the V4-Flash shapes, memcheck over the test, and, when .gpu/test_gpu_mma16-bug was staged
# (tools/gpu/stage_mma16_bug.sh), the deliberately broken build, which must fail. Then (MMA16_FLASH=0 skips it) Flash
# OFFICIAL decode and prefill, two rounds, against .gpu/dsv4-old when staged (tools/gpu/stage_variant.sh dsv4-old
# "-DMMA16_ON=0": the same build with these linears on CUDA cores). Logs under $OUT.
. tools/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader >"$OUT/gpu.txt" 2>&1
.gpu/gputests/test_gpu_mma16 >"$OUT/mma16_test.log" 2>&1
echo "test_gpu_mma16 rc=$? at $(el) s" | tee -a "$OUT/mma16_test.log"
.gpu/gputests/test_gpu_mma16 --bench >"$OUT/mma16_bench.log" 2>&1
echo "test_gpu_mma16 --bench rc=$? at $(el) s" | tee -a "$OUT/mma16_bench.log"
if [ -x .gpu/test_gpu_mma16-bug ]; then
  .gpu/test_gpu_mma16-bug >"$OUT/mma16_bug.log" 2>&1
  echo "test_gpu_mma16-bug (-DDSV4_MMA16_BUG) rc=$? (must not be 0) at $(el) s" | tee -a "$OUT/mma16_bug.log"
fi
if [ "${MMA16_MEMCHECK_SECONDS:-150}" != 0 ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout "${MMA16_MEMCHECK_SECONDS:-150}" "$CS" --tool memcheck --error-exitcode 9 .gpu/gputests/test_gpu_mma16 >"$OUT/mma16_memcheck.log" 2>&1
  echo "memcheck test_gpu_mma16 rc=$? (124: timed out) at $(el) s" | tee -a "$OUT/mma16_memcheck.log"
fi
if [ "${MMA16_FLASH:-1}" = 1 ]; then   # Flash OFFICIAL: this build against .gpu/dsv4-old (-DMMA16_ON=0) when staged
  bins=".gpu/dsv4"; [ -x .gpu/dsv4-old ] && bins=".gpu/dsv4 .gpu/dsv4-old"
  for r in 1 2; do for b in $bins; do
    echo "== $b round $r, prompt 256" >>"$OUT/flash.log"
    timeout 90 "$b" bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 --no-bandwidth >>"$OUT/flash.log" 2>&1
    echo "exit $? at $(el) s" >>"$OUT/flash.log"
  done; done
  for b in $bins; do
    echo "== $b prompt 4096" >>"$OUT/flash.log"
    timeout 120 "$b" bench --synthetic flash --device cuda --mode official --prompt 4096 --decode 4 --no-bandwidth >>"$OUT/flash.log" 2>&1
    echo "exit $? at $(el) s" >>"$OUT/flash.log"
  done
  grep -E "^==|prefill|decode, 1|speculative|rror|exit" "$OUT/flash.log"
fi
tail -n 40 "$OUT/mma16_test.log"
cat "$OUT/mma16_bench.log"
