#!/usr/bin/env bash
# The queue left for the next GPU session (docs/GPU_RUNS.md, the row after run 23), in one call of ~8 minutes.
# Stage first, here:
#   NVFLAGS="-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -DDEV_HW_DECODE=1" bash tools/gpu/stage.sh
#   tools/gpu/stage_variant.sh dsv4-old ""        # the same tree with the default (per-element) decode
# then `run` with carry [".gpu"]: bash tools/gpu/run_next.sh. Logs under $OUT; the lines that matter last.
. tools/gpu/env.sh
# 1. the GPU suite, built with DEV_HW_DECODE=1 (its kernels decode FP8/FP4 weights the new way)
BUILD=.gpu VERBOSE=1 timeout 240 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
# 2. decode A/B on the Flash shape, alternating, two rounds
for r in 1 2; do for b in dsv4 dsv4-old; do
  echo "== $b round $r" >>"$OUT/ab.log"
  timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 16 --no-bandwidth >>"$OUT/ab.log" 2>&1
done; done
# 3. decode at long contexts (fp8 KV), JSON report
timeout 150 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 \
    --context 4096,131072,1048576 --json "$OUT/flash-context.json" >"$OUT/context.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/context.log"
# 4. drafter states in the disk prefix tier, across a server restart, on cuda
for k in v4:mtp dspark:dspark; do
  .gpu/dsv4 tiny -o /tmp/serve-${k%%:*} --seed 3 --mtp ${k%%:*} --tokenizer .gpu/serve-tokenizer.json --set vocab_size=271 \
      --set bos_token_id=264 --set eos_token_id=265 >/dev/null 2>&1
  timeout 120 python3 tools/gpu/serve_restart_check.py .gpu/dsv4 /tmp/serve-${k%%:*} cuda ${k#*:} >>"$OUT/restart.log" 2>&1
done
# 5. constrained decoding's share of a batched Flash decode step (the real vocabulary)
python3 -c "import lzma; open('/tmp/dsv4-synthetic-flash/tokenizer.json','wb').write(lzma.open('.gpu/v4tok/tokenizer.json.xz').read())" &&
  cp .gpu/v4tok/tokenizer_config.json /tmp/dsv4-synthetic-flash/ &&
  timeout 120 .gpu/dsv4 bench --grammar -m /tmp/dsv4-synthetic-flash --device cuda >"$OUT/grammar.log" 2>&1
echo "== suite:"; grep -E "^FAIL|passed, .* failed|suite exit" "$OUT/suite.log" | tail -6
echo "== A/B (dsv4 = DEV_HW_DECODE 1):"; grep -E "==|decode, 1|rror" "$OUT/ab.log"
echo "== context:"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+$|rror|exit" "$OUT/context.log"
echo "== restart:"; cat "$OUT/restart.log" | tail -4
echo "== grammar on Flash:"; grep -E "B=|rror" "$OUT/grammar.log"
echo "total $(el) s"
