#!/usr/bin/env bash
# One device call (session 2026-12-02, run 34): everything of this session together. Stage: tools/gpu/stage.sh,
# tools/gpu/stage_variant.sh dsv4-off "-DMMA16_ON=0" (the BF16 tensor-core linears compiled out), the run-33 build
# (063439d, bits = a91dc5c) as .gpu/dsv4-old, tools/gpu/fuzz_stage.sh; carry [".gpu", ".fuzz"].
#   0. fuzzing in the background (FUZZ_SECONDS, FUZZ_CORES);
#   1. the GPU suite (test_gpu_indexer, the tensor-core attention and BF16 linears, the parity matrix);
#   2. the same bits as run 33 with every new arithmetic switched off (dsv4-off, DSV4_CUDA_IDX_MMA=0,
#      DSV4_CUDA_ATT_MMA=0): the fusions, the new top-k and the early ring write change no bit;
#   3. Flash OFFICIAL: decode at prompt 256 with 8 / 32 / 64 streams (new), the old build once; prefill of 8192 tokens
#      new and old; decode after 4K / 128K / 1M of context (fp8 KV): new, new with DSV4_CUDA_IDX_MMA=0, old.
. tools/gpu/env.sh
for b in dsv4-off dsv4-old; do [ -f .gpu/$b.xz ] && xz -dk .gpu/$b.xz; done
if [ -n "${FUZZ_SECONDS:-}" ]; then OUT="$OUT" FUZZ_TARGETS="${FUZZ_TARGETS:-}" tools/gpu/fuzz_bg.sh start "$FUZZ_SECONDS" "${FUZZ_CORES:-13}"; fi
BUILD=.gpu VERBOSE=1 timeout 300 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
W=/tmp/wide
.gpu/dsv4 tiny -o $W --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 \
    --set hidden_size=1024 --set q_lora_rank=1024 --set moe_intermediate_size=1024 --set o_lora_rank=512 >/dev/null 2>&1
TOK=$(awk 'BEGIN{for(i=0;i<300;i++) printf "%s%d", (i?",":""), (i*37+3)%260}')
OFF="DSV4_CUDA_IDX_MMA=0 DSV4_CUDA_ATT_MMA=0"
{
for m in $W .gpu/testdata/official_calm/calmpro/checkpoint .gpu/serve-model; do
  for kv in fp8 bf16; do
    env $OFF .gpu/dsv4-off logits -m $m --device cuda --mode official --kv $kv --tokens "$TOK" --out /tmp/off.npy 2>&1 | tail -1
    .gpu/dsv4-old logits -m $m --device cuda --mode official --kv $kv --tokens "$TOK" --out /tmp/old.npy 2>&1 | tail -1
    .gpu/dsv4 logits -m $m --device cuda --mode official --kv $kv --tokens "$TOK" --out /tmp/new.npy 2>&1 | tail -1
    .gpu/dsv4 logits -m $m --device cuda --mode official --kv $kv --tokens "$TOK" --chunks 5,1,17,64 --out /tmp/newc.npy 2>&1 | tail -1
    cmp -s /tmp/off.npy /tmp/old.npy && r1=same || r1=DIFFERENT
    cmp -s /tmp/newc.npy /tmp/new.npy && r2=same || r2=DIFFERENT
    echo "bits $(basename $m) $kv: new arithmetic off vs run 33 $r1; new chunked vs one call $r2"
    python3 -c "
import numpy as np; a=np.load('/tmp/new.npy'); b=np.load('/tmp/old.npy')
print('  new vs run 33: max |d| / max |logit| %.3g, argmax agree %.1f%%' % (np.abs(a-b).max()/np.abs(b).max(), 100*(a.argmax(1)==b.argmax(1)).mean()))"
  done
done
} >"$OUT/bits.log" 2>&1
timeout 120 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 48 --streams 8,32,64 --json "$OUT/flash.json" >"$OUT/flash.log" 2>&1
timeout 60 .gpu/dsv4-old bench --synthetic flash --device cuda --mode official --prompt 256 --decode 48 --no-bandwidth >"$OUT/flash_old.log" 2>&1
for b in dsv4 dsv4-old; do
  timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 8192 --decode 2 --no-bandwidth >"$OUT/prefill_$b.log" 2>&1
done
for v in new idxoff old; do
  case $v in new) cmd=".gpu/dsv4";; idxoff) cmd="env DSV4_CUDA_IDX_MMA=0 .gpu/dsv4";; old) cmd=".gpu/dsv4-old";; esac
  echo "== $v" >>"$OUT/context.log"
  timeout 120 $cmd bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 --no-bandwidth \
      --context 4096,131072,1048576 >>"$OUT/context.log" 2>&1
  echo "exit $? at $(el) s" >>"$OUT/context.log"
done
echo "== suite:"; grep -E "FAIL|passed, .* failed|suite exit|1M|K >= 1024" "$OUT/suite.log" | tail -16
echo "== bits:"; grep -E "^bits|new vs run|rror" "$OUT/bits.log"
echo "== flash:"; grep -E "bandwidth|prefill|decode|fraction|verify|^ +(8|32|64) |rror" "$OUT/flash.log"
echo "== old:"; grep -E "decode, 1|verify" "$OUT/flash_old.log"
echo "== prefill 8K:"; grep -h -E "prefill|rror" "$OUT"/prefill_dsv4.log "$OUT"/prefill_dsv4-old.log
echo "== context:"; grep -E "^==|^ +[0-9]+ +[0-9.]+ +[0-9.]+|rror|exit" "$OUT/context.log"
if [ -n "${FUZZ_SECONDS:-}" ]; then echo "== fuzz:"; OUT="$OUT" tools/gpu/fuzz_bg.sh stop | tail -16; fi
echo "total $(el) s"
