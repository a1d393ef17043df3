#!/usr/bin/env bash
# Issue 18, the chunked attention (k_attention.cu ATT_CHUNKED), in one device call. Stage first:
#   tools/gpu/stage.sh && tools/gpu/stage_variant.sh dsv4-old "-DATT_CHUNKED=0"
# then `run` with carry [".gpu"]: bash tools/gpu/run_attn.sh
#   1. test_gpu_attention alone (cu_attention on 20,000 HCA rows, top-512 CSA, ... against a double reference;
#      alone = in a step = in groups, memcmp), then the whole GPU suite;
#   2. Flash decode after 4K / 128K / 1M of context (fp8 KV, OFFICIAL, --profile) with the chunked attention;
#   3. A/B, dsv4 (ATT_CHUNKED 1) vs dsv4-old (0): decode at a 256-token prompt (two rounds, alternating), then the
#      old kernel after 4K / 128K (its 1M costs ~0.5 s a token: left out unless OLD_1M=1).
# Lines that matter last.
. tools/gpu/env.sh
timeout 120 .gpu/gputests/test_gpu_attention >"$OUT/attention.log" 2>&1
echo "test_gpu_attention exit $? at $(el) s" >>"$OUT/attention.log"
BUILD=.gpu VERBOSE=1 timeout "${SUITE_SECONDS:-300}" tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
timeout 240 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 --profile \
    --context 4096,131072,1048576 --json "$OUT/flash-context.json" >"$OUT/context.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/context.log"
for r in 1 2; do for b in dsv4 dsv4-old; do
  echo "== $b round $r" >>"$OUT/ab.log"
  timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 16 --no-bandwidth >>"$OUT/ab.log" 2>&1
done; done
CTX_OLD=4096,131072
[ "${OLD_1M:-0}" = 1 ] && CTX_OLD=4096,131072,1048576
timeout 240 .gpu/dsv4-old bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 --profile \
    --context "$CTX_OLD" >"$OUT/context-old.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/context-old.log"
echo "== test_gpu_attention:"; grep -E "keys:|OK|FAIL|PASSED|rror|exit" "$OUT/attention.log"
echo "== suite:"; grep -E "^FAIL|passed, .* failed|suite exit" "$OUT/suite.log" | tail -6
echo "== context (chunked):"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+|decode, 1 stream|rror|exit|index|attend" "$OUT/context.log" | head -30
echo "== A/B (dsv4 = ATT_CHUNKED 1, dsv4-old = 0):"; grep -E "==|prefill|decode, 1|rror" "$OUT/ab.log"
echo "== context (old kernel):"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+|decode, 1 stream|rror|exit|attend" "$OUT/context-old.log" | head -20
echo "total $(el) s"
