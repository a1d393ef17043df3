#!/usr/bin/env bash
# One device call (~6 minutes; stage first with tools/gpu/stage.sh, then `run` with carry [".gpu"]):
#   1. the GPU suite (the indexer's new scoring and selection kernels are inside test_gpu_parity / test_gpu_vs_cpu);
#   2. Flash decode after contexts of 4K / 128K / 1M (fp8 KV), with the per-stage profile of each;
#   2b. one-token GEMV A/B: .gpu/dsv4 (LIN_PIPE 1, the pipelined kernels) against .gpu/dsv4-old (LIN_PIPE 0),
#       Flash decode at a 256-token prompt, alternating, two rounds (stage_variant.sh dsv4-old "-DLIN_PIPE=0");
#   3. Nsight Compute, kernel time and DRAM bytes only (one pass), over the launches of a one-token Flash step;
#   4. the host CPU (issue 17): flash-2g decode, prefill and streams on all its cores, both modes, --amx if it has AMX.
# The flash-2g checkpoint is written in the background from the start (run 17's lesson). Lines that matter last.
. tools/gpu/env.sh
(.gpu/dsv4 bench --synthetic flash-2g --device cpu --prompt 4 --decode 2 --no-bandwidth >"$OUT/write2g.log" 2>&1; echo done >>"$OUT/write2g.log") &
W2G=$!
BUILD=.gpu VERBOSE=1 timeout 240 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
timeout 240 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --kv fp8 --prompt 64 --decode 8 --profile \
    --context 4096,131072,1048576 --json "$OUT/flash-context.json" >"$OUT/context.log" 2>&1
echo "exit $? at $(el) s" >>"$OUT/context.log"
for r in 1 2; do for b in dsv4 dsv4-old; do
  echo "== $b round $r" >>"$OUT/ab.log"
  timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 16 --no-bandwidth >>"$OUT/ab.log" 2>&1
done; done
NCU_SECONDS=200 NCU_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__waves_per_multiprocessor \
    bash tools/gpu/ncu_step.sh >"$OUT/ncu.log" 2>&1
echo "ncu done at $(el) s" >>"$OUT/ncu.log"
wait $W2G
{ lscpu | grep -E "Model name|^CPU\(s\)|NUMA node\(s\)|Flags" | sed 's/Flags:.*\(amx_tile\).*/AMX: yes/; s/Flags:.*/AMX: no/'
  for mode in official exact; do
    timeout 100 .gpu/dsv4 bench --synthetic flash-2g --device cpu --mode $mode --prompt 128 --decode 32 --streams 16,64
  done
  if grep -q amx_tile /proc/cpuinfo; then timeout 100 .gpu/dsv4 bench --synthetic flash-2g --device cpu --mode official --amx --prompt 128 --decode 32 --streams 16,64; fi
} >"$OUT/cpu.log" 2>&1
echo "cpu done at $(el) s" >>"$OUT/cpu.log"
echo "== suite:"; grep -E "^FAIL|passed, .* failed|suite exit" "$OUT/suite.log" | tail -6
echo "== context:"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+|decode, 1 stream|rror|exit|index|attend" "$OUT/context.log" | head -30
echo "== A/B (dsv4 = LIN_PIPE 1):"; grep -E "==|decode, 1|rror" "$OUT/ab.log"
echo "== ncu:"; head -45 "$OUT/ncu.log"
echo "== cpu:"; grep -E "Model|CPU|AMX|mode|bandwidth|prefill|decode, 1|fraction|streams|^ +(16|64) " "$OUT/cpu.log" | head -40
echo "total $(el) s"
