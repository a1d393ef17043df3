#!/usr/bin/env bash
# Issue 18, OFFICIAL attention on bf16 tensor cores (k_attention.cu k_att_scores_mma / k_att_pv_mma), in one device
# call (~5 min). Stage first:
#   tools/gpu/stage.sh && tools/gpu/stage_variant.sh dsv4-pg1 "-DATT_PG=1"
# then `run` with carry [".gpu"]: bash tools/gpu/run_attmma.sh
#   1. test_gpu_attention alone (EXACT on CUDA cores; OFFICIAL on CUDA cores and on tensor cores: each against a
#      double reference, alone = in a step = in groups by memcmp), then the whole GPU suite (tensor cores on);
#   2. Flash OFFICIAL A/B, DSV4_CUDA_ATT_MMA=1 vs 0: an 8192-token prefill (--profile: the attention stage) and
#      decode after a 4K context (fp8 KV, --profile);
#   3. the P.V part width: dsv4-pg1 (ATT_PG 1: parts of 64 keys, 4x the parts, 4x the blocks at decode) on the same
#      two runs, to see whether decode wants narrower parts than prefill does.
# Lines that matter last.
. tools/gpu/env.sh
timeout 120 .gpu/gputests/test_gpu_attention >"$OUT/attention.log" 2>&1
echo "test_gpu_attention exit $? at $(el) s" >>"$OUT/attention.log"
BUILD=.gpu VERBOSE=1 timeout "${SUITE_SECONDS:-240}" tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
for v in 1 0 pg1; do
  b=dsv4; env=DSV4_CUDA_ATT_MMA=$v
  [ "$v" = pg1 ] && { b=dsv4-pg1; env=DSV4_CUDA_ATT_MMA=1; [ -x .gpu/$b ] || continue; }
  echo "== $b $env" >>"$OUT/prefill.log"
  env $env timeout 100 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 8192 --decode 4 --no-bandwidth \
      --profile >>"$OUT/prefill.log" 2>&1
  echo "exit $? at $(el) s" >>"$OUT/prefill.log"
  echo "== $b $env" >>"$OUT/decode.log"
  env $env timeout 100 .gpu/$b bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 \
      --no-bandwidth --context 4096 --profile >>"$OUT/decode.log" 2>&1
  echo "exit $? at $(el) s" >>"$OUT/decode.log"
done
echo "== test_gpu_attention:"; grep -E "keys|differ|OK|FAIL|PASSED|rror|exit" "$OUT/attention.log"
echo "== suite:"; grep -E "^FAIL|FAIL|passed, .* failed|suite exit|attention" "$OUT/suite.log" | tail -12
echo "== prefill 8K (DSV4_CUDA_ATT_MMA=1 / 0 / ATT_PG 1):"; grep -E "^==|prefill|attention|attend|rror|exit" "$OUT/prefill.log"
echo "== decode after 4K:"; grep -E "^==|^ +[0-9]+ +[0-9.]+ +[0-9.]+|decode, 1|attention|attend|rror|exit" "$OUT/decode.log"
echo "total $(el) s"
