#!/usr/bin/env bash
# One device call (session 2026-12-02, run 36), the last: stage tools/gpu/stage.sh, tools/gpu/stage_variant.sh
# dsv4-e4sw "-DDEV_HW_E4M3=0" (xz), tools/gpu/fuzz_stage.sh; carry [".gpu", ".fuzz"].
#   1. the GPU suite (every float through the hardware E4M3 conversion = the code search);
#   2. the same logits with the hardware conversion as with the search (three models, cmp);
#   3. ncu over one Flash step of one token (caches not flushed), time per kernel;
#   4. the final Flash numbers: decode, 8 / 32 / 64 streams, an 8K prefill, decode after 4K / 128K / 1M (fp8 KV).
. tools/gpu/env.sh
for b in dsv4-e4sw; do [ -f .gpu/$b.xz ] && xz -dk .gpu/$b.xz; done
if [ -n "${FUZZ_SECONDS:-}" ]; then OUT="$OUT" FUZZ_TARGETS="${FUZZ_TARGETS:-}" tools/gpu/fuzz_bg.sh start "$FUZZ_SECONDS" "${FUZZ_CORES:-13}"; fi
BUILD=.gpu VERBOSE=1 timeout 300 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
W=/tmp/wide
.gpu/dsv4 tiny -o $W --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 \
    --set hidden_size=1024 --set q_lora_rank=1024 --set moe_intermediate_size=1024 --set o_lora_rank=512 >/dev/null 2>&1
TOK=$(awk 'BEGIN{for(i=0;i<300;i++) printf "%s%d", (i?",":""), (i*37+3)%260}')
for m in $W .gpu/testdata/official_calm/calmpro/checkpoint .gpu/serve-model; do
  for b in dsv4 dsv4-e4sw; do .gpu/$b logits -m $m --device cuda --mode official --kv fp8 --tokens "$TOK" --out /tmp/$b.npy >/dev/null 2>&1; done
  cmp -s /tmp/dsv4.npy /tmp/dsv4-e4sw.npy && r=same || r=DIFFERENT
  echo "bits $(basename $m): hardware E4M3 vs code search $r" >>"$OUT/bits.log"
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
timeout 75 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    --csv --page raw --kernel-name "regex:^k_([^f]|f[^i])" --launch-count 1400 \
    .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 1 --decode 1 --no-bandwidth >"$OUT/ncu.csv" 2>/dev/null
python3 tools/gpu/ncu_summary.py "$OUT/ncu.csv" k_embed 0 >"$OUT/ncu.txt" 2>&1
timeout 100 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 48 --streams 8,32,64 --json "$OUT/flash.json" >"$OUT/flash.log" 2>&1
timeout 80 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 8192 --decode 2 --no-bandwidth >"$OUT/prefill.log" 2>&1
timeout 110 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 --no-bandwidth \
    --context 4096,131072,1048576 >"$OUT/context.log" 2>&1
echo "== suite:"; grep -E "FAIL|passed, .* failed|suite exit|2\^32" "$OUT/suite.log" | tail -8
echo "== bits:"; cat "$OUT/bits.log"
echo "== ncu:"; head -32 "$OUT/ncu.txt"
echo "== flash:"; grep -E "bandwidth|prefill|decode|fraction|verify|^ +(8|32|64) |rror" "$OUT/flash.log"
echo "== prefill 8K:"; grep -E "prefill|rror" "$OUT/prefill.log"
echo "== context:"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+|rror" "$OUT/context.log"
if [ -n "${FUZZ_SECONDS:-}" ]; then echo "== fuzz:"; OUT="$OUT" tools/gpu/fuzz_bg.sh stop | tail -16; fi
echo "total $(el) s"
