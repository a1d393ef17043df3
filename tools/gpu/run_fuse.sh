#!/usr/bin/env bash
# One device call (session 2026-12-02, run 33): the fused OFFICIAL prologues/epilogues (raw rows packed for the
# tensor cores, BF16 rounding in their epilogue, hc_pre + RMSNorm in one block) against the build before them
# (.gpu/dsv4-old, commit 063439d). Stage: tools/gpu/stage.sh, the old binary copied to .gpu/dsv4-old,
# tools/gpu/fuzz_stage.sh; carry [".gpu", ".fuzz"].
#   0. fuzzing in the background (FUZZ_SECONDS, FUZZ_CORES);
#   1. the GPU suite;
#   2. the same bits: logits of three models (K >= 1024 OFFICIAL fp8 / bf16 KV, calmpro, the tiny serve model) in one
#      call and in chunks, new vs old binary, compared with cmp;
#   3. Flash OFFICIAL decode / prefill at prompt 256, old and new, two rounds each.
. tools/gpu/env.sh
if [ -n "${FUZZ_SECONDS:-}" ]; then OUT="$OUT" FUZZ_TARGETS="${FUZZ_TARGETS:-}" tools/gpu/fuzz_bg.sh start "$FUZZ_SECONDS" "${FUZZ_CORES:-13}"; fi
BUILD=.gpu VERBOSE=1 timeout 240 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
W=/tmp/wide
.gpu/dsv4 tiny -o $W --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 \
    --set hidden_size=1024 --set q_lora_rank=1024 --set moe_intermediate_size=1024 --set o_lora_rank=512 >/dev/null 2>&1
TOK=$(awk 'BEGIN{for(i=0;i<300;i++) printf "%s%d", (i?",":""), (i*37+3)%260}')
{
for m in $W .gpu/testdata/official_calm/calmpro/checkpoint .gpu/serve-model; do
  for kv in fp8 bf16; do
    for b in dsv4 dsv4-old; do
      .gpu/$b logits -m $m --device cuda --mode official --kv $kv --tokens "$TOK" --out /tmp/$b.a.npy 2>&1 | tail -1
      .gpu/$b logits -m $m --device cuda --mode official --kv $kv --tokens "$TOK" --chunks 5,1,17,64 --out /tmp/$b.b.npy 2>&1 | tail -1
    done
    cmp -s /tmp/dsv4.a.npy /tmp/dsv4-old.a.npy && r1=same || r1=DIFFERENT
    cmp -s /tmp/dsv4.b.npy /tmp/dsv4.a.npy && r2=same || r2=DIFFERENT
    echo "bits $(basename $m) $kv: new vs old $r1; new chunked vs one call $r2"
  done
done
} >"$OUT/bits.log" 2>&1
for round in 1 2; do
  for b in dsv4 dsv4-old; do
    echo "== $b round $round" >>"$OUT/ab.log"
    timeout 100 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 48 >>"$OUT/ab.log" 2>&1
  done
done
echo "== suite:"; grep -E "FAIL|passed, .* failed|suite exit|K >= 1024|packed raw" "$OUT/suite.log" | tail -14
echo "== bits:"; grep -E "^bits|rror" "$OUT/bits.log"
echo "== A/B:"; grep -E "^==|prefill|decode, 1|fraction|verify" "$OUT/ab.log"
if [ -n "${FUZZ_SECONDS:-}" ]; then echo "== fuzz:"; OUT="$OUT" tools/gpu/fuzz_bg.sh stop | tail -16; fi
echo "total $(el) s"
