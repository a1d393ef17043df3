#!/usr/bin/env bash
# Device call of session 2026-12-02b (run 37): stage tools/gpu/stage.sh and tools/gpu/fuzz_stage.sh; carry
# [".gpu", ".fuzz"]; FUZZ_SECONDS / FUZZ_CORES / FUZZ_TARGETS for fuzzing in the background.
#   1. the GPU suite (test_gpu_graphs: programmatic edges on = off = direct launches, memcmp);
#   2. the same logits with programmatic edges (DSV4_CUDA_PDL=1, the default), without (=0) and without graphs
#      (DSV4_CUDA_GRAPHS=0): three models, fp8 KV, cmp;
#   3. Flash decode at prompt 256, PDL on / off alternated twice; streams 8 / 32 / 64 with it on.
. tools/gpu/env.sh
if [ -n "${FUZZ_SECONDS:-}" ]; then OUT="$OUT" FUZZ_TARGETS="${FUZZ_TARGETS:-}" tools/gpu/fuzz_bg.sh start "$FUZZ_SECONDS" "${FUZZ_CORES:-12}"; fi
BUILD=.gpu VERBOSE=1 timeout 300 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
W=/tmp/wide
.gpu/dsv4 tiny -o $W --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 \
    --set hidden_size=1024 --set q_lora_rank=1024 --set moe_intermediate_size=1024 --set o_lora_rank=512 >/dev/null 2>&1
TOK=$(awk 'BEGIN{for(i=0;i<300;i++) printf "%s%d", (i?",":""), (i*37+3)%260}')
for m in $W .gpu/testdata/official_calm/calmpro/checkpoint .gpu/serve-model; do
  .gpu/dsv4 logits -m $m --device cuda --mode official --kv fp8 --tokens "$TOK" --out /tmp/pdl1.npy >/dev/null 2>&1
  DSV4_CUDA_PDL=0 .gpu/dsv4 logits -m $m --device cuda --mode official --kv fp8 --tokens "$TOK" --out /tmp/pdl0.npy >/dev/null 2>&1
  DSV4_CUDA_GRAPHS=0 .gpu/dsv4 logits -m $m --device cuda --mode official --kv fp8 --tokens "$TOK" --out /tmp/direct.npy >/dev/null 2>&1
  cmp -s /tmp/pdl1.npy /tmp/pdl0.npy && a=same || a=DIFFERENT
  cmp -s /tmp/pdl1.npy /tmp/direct.npy && b=same || b=DIFFERENT
  echo "bits $(basename $m): PDL on vs off $a, vs direct launches $b ($(stat -c %s /tmp/pdl1.npy) bytes)" >>"$OUT/bits.log"
done
for r in 1 2; do
  for p in 1 0; do
    DSV4_CUDA_PDL=$p timeout 60 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 48 \
        --no-bandwidth >"$OUT/decode_pdl$p.$r.log" 2>&1
    echo "PDL=$p round $r: $(grep -E '^decode' "$OUT/decode_pdl$p.$r.log" | head -1)" >>"$OUT/ab.log"
  done
done
timeout 100 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 48 --streams 8,32,64 --json "$OUT/flash.json" >"$OUT/flash.log" 2>&1
echo "== suite:"; grep -E "FAIL|passed, .* failed|suite exit|programmatic" "$OUT/suite.log" | tail -10
echo "== bits:"; cat "$OUT/bits.log"
echo "== decode A/B:"; cat "$OUT/ab.log"
echo "== flash:"; grep -E "bandwidth|prefill|decode|fraction|verify|graphs|^ +(8|32|64) |rror" "$OUT/flash.log"
if [ -n "${FUZZ_SECONDS:-}" ]; then echo "== fuzz:"; OUT="$OUT" tools/gpu/fuzz_bg.sh stop | tail -16; fi
echo "total $(el) s"
