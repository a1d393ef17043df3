#!/usr/bin/env bash
# One device call (~4-5 minutes; stage with tools/gpu/stage.sh, and tools/gpu/stage_variant.sh dsv4-old
# "-DATT_CHUNKED=0" for the attention A/B; carry [".gpu"]):
#   1. the GPU suite (tensor-core linears, CUDA graphs, the chunked attention and its own test);
#   2. Flash, OFFICIAL: decode at prompt 256 with 8 / 32 / 64 streams; prefill of an 8192-token prompt;
#   3. decode after 4K / 128K / 1M contexts (fp8 KV), new attention against the old (dsv4-old), one run each.
. tools/gpu/env.sh
BUILD=.gpu VERBOSE=1 timeout 200 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
timeout 100 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 --streams 8,32,64 \
    --json "$OUT/flash.json" >"$OUT/flash.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/flash.log"
timeout 100 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 8192 --decode 4 --no-bandwidth >"$OUT/prefill8k.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/prefill8k.log"
for b in dsv4 dsv4-old; do
  [ -x .gpu/$b ] || continue
  echo "== $b" >>"$OUT/context.log"
  timeout 120 .gpu/$b bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 --no-bandwidth \
      --context 4096,131072,1048576 >>"$OUT/context.log" 2>&1
  echo "exit $? at $(el) s" >>"$OUT/context.log"
done
echo "== suite:"; grep -E "^FAIL|FAIL|passed, .* failed|suite exit|attention" "$OUT/suite.log" | tail -12
echo "== flash:"; grep -E "model|bandwidth|prefill|decode|fraction|verify|^ +(8|32|64) |rror|exit" "$OUT/flash.log"
echo "== prefill 8K:"; grep -E "prefill|decode, 1|rror|exit" "$OUT/prefill8k.log"
echo "== context:"; grep -E "^==|^ +[0-9]+ +[0-9.]+ +[0-9.]+|rror|exit" "$OUT/context.log"
echo "total $(el) s"
