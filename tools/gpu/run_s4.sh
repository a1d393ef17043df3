#!/usr/bin/env bash
# One device call (session 2026-12-02, run 35): the merged session (fusions, int8 indexer, BF16 tensor-core linears,
# tensor-core attention). Stage: tools/gpu/stage.sh; tools/gpu/stage_variant.sh dsv4-off16 "-DMMA16_ON=0"; the builds
# of 5dc2fab (the fusions alone) and 063439d (before them) as .gpu/dsv4-fuse.xz and .gpu/dsv4-old.xz (xz: the carry
# limit); tools/gpu/fuzz_stage.sh; carry [".gpu", ".fuzz"].
#   0. fuzzing in the background (FUZZ_SECONDS, FUZZ_CORES);
#   1. the GPU suite;
#   2. decode at prompt 256, one binary or switch at a time (run 34's decode fell from 51.3 to 47.4 tok/s: which part);
#   3. ncu over the first step of one token (caches not flushed): the linears', attention's and mHC's kernels;
#   4. the final Flash numbers: 8 / 32 / 64 streams, an 8K prefill, decode after 4K / 128K / 1M (fp8 KV).
. tools/gpu/env.sh
for b in dsv4-fuse dsv4-old dsv4-off16; do [ -f .gpu/$b.xz ] && xz -dk .gpu/$b.xz; done
if [ -n "${FUZZ_SECONDS:-}" ]; then OUT="$OUT" FUZZ_TARGETS="${FUZZ_TARGETS:-}" tools/gpu/fuzz_bg.sh start "$FUZZ_SECONDS" "${FUZZ_CORES:-13}"; fi
BUILD=.gpu VERBOSE=1 timeout 300 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
B="bench --synthetic flash --device cuda --mode official --prompt 256 --decode 24 --no-bandwidth"
for v in new att0 off16 fuse old; do
  case $v in new|new2) cmd=".gpu/dsv4";; att0) cmd="env DSV4_CUDA_ATT_MMA=0 .gpu/dsv4";; off16) cmd=".gpu/dsv4-off16";;
             fuse) cmd=".gpu/dsv4-fuse";; old) cmd=".gpu/dsv4-old";; esac
  echo "== $v" >>"$OUT/ab.log"; timeout 60 $cmd $B >>"$OUT/ab.log" 2>&1
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
for b in dsv4 dsv4-fuse; do
  timeout 75 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
      --csv --page raw --kernel-name "regex:^k_([^f]|f[^i])" --launch-count 1400 \
      .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 1 --decode 1 --no-bandwidth >"$OUT/ncu_$b.csv" 2>/dev/null
  python3 tools/gpu/ncu_summary.py "$OUT/ncu_$b.csv" k_embed 0 >"$OUT/ncu_$b.txt" 2>&1
done
timeout 100 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 256 --decode 48 --streams 8,32,64 --json "$OUT/flash.json" >"$OUT/flash.log" 2>&1
timeout 80 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 8192 --decode 2 --no-bandwidth >"$OUT/prefill.log" 2>&1
timeout 110 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 --no-bandwidth \
    --context 4096,131072,1048576 >"$OUT/context.log" 2>&1
echo "== suite:"; grep -E "FAIL|passed, .* failed|suite exit" "$OUT/suite.log" | tail -8
echo "== A/B decode:"; grep -E "^==|decode, 1|verify|prefill|rror" "$OUT/ab.log"
for b in dsv4 dsv4-fuse; do echo "== ncu $b:"; head -30 "$OUT/ncu_$b.txt"; done
echo "== flash:"; grep -E "bandwidth|prefill|decode|fraction|verify|^ +(8|32|64) |rror" "$OUT/flash.log"
echo "== prefill 8K:"; grep -E "prefill|rror" "$OUT/prefill.log"
echo "== context:"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+|rror" "$OUT/context.log"
if [ -n "${FUZZ_SECONDS:-}" ]; then echo "== fuzz:"; OUT="$OUT" tools/gpu/fuzz_bg.sh stop | tail -16; fi
echo "total $(el) s"
