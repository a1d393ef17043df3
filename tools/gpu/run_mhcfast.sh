#!/usr/bin/env bash
# One device call for issue 18's mHC and routing kernels (helper mhcfast). Stage first: tools/gpu/stage.sh, then
# tools/gpu/stage_variant.sh dsv4-mhcold "-DDSV4_MHC_FAST=0 -DDSV4_MOE_FAST=0" (the kernels as before); carry [".gpu"].
#   1. the GPU suite (test_gpu_vs_cpu, test_gpu_parity, test_gpu_graphs, test_gpu_ep, test_gpu_host_experts run
#      hc_pre_finish, hc_post, hc_post_moe, route and moe_plan inside whole steps);
#   2. bits: the same logits from both builds, OFFICIAL and EXACT, on tiny models with hidden 1024 (k_hc_pre_fast<4>;
#      64 experts top 6) and 4096 (<16>, Flash's), calmpro and the serve model (hidden 256: <1>), 300 tokens in one step and
#      in steps of 200, 64, 8, 3 and 1 token (--chunks);
#   3. Flash decode at prompt 256, new and old builds alternating, two rounds;
#   4. ncu over one Flash decode step, only the kernels changed (+ k_embed, which marks the steps), both builds;
#   everything in $OUT/mhcfast.tgz, the summary on stdout. SUITE=0 skips 1, NCU_RUN=0 skips 4 (~6-7 min in all).
. tools/gpu/env.sh
# the logs in one folder, packed into $OUT/mhcfast.tgz at the end (the device tool returns at most 8 files)
L=/tmp/mhcfast-logs; rm -rf $L; mkdir -p $L
if [ "${SUITE:-1}" = 1 ]; then
  BUILD=.gpu VERBOSE=1 timeout "${SUITE_SECONDS:-300}" tests/run_gpu.sh >"$L/suite.log" 2>&1
  echo "suite exit $? at $(el) s" >>"$L/suite.log"
fi
TOK=$(awk 'BEGIN{for(i=0;i<300;i++) printf "%s%d", (i?",":""), (i*37+3)%260}')
# hidden 1024 with 64 experts, top 6 (route: 2 experts a lane; hash rows in layers 0-1); hidden 4096 as Flash's
.gpu/dsv4 tiny -o /tmp/wide1024 --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 \
    --set index_topk=3 --set hidden_size=1024 --set q_lora_rank=1024 --set moe_intermediate_size=256 --set o_lora_rank=512 \
    --set n_routed_experts=64 --set num_experts_per_tok=6 >/dev/null 2>&1
.gpu/dsv4 tiny -o /tmp/wide4096 --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 \
    --set index_topk=3 --set hidden_size=4096 --set q_lora_rank=512 --set moe_intermediate_size=256 --set o_lora_rank=512 \
    >/dev/null 2>&1
for m in /tmp/wide1024 /tmp/wide4096 .gpu/testdata/official_calm/calmpro/checkpoint .gpu/serve-model; do
  for mode in official exact; do
    for feed in "" "--chunks 200,64,8,3"; do   # one step of 300 tokens; steps of 200, 64, 8, 3, then 25 of one token
      for b in dsv4 dsv4-mhcold; do
        .gpu/$b logits -m $m --device cuda --mode $mode --tokens "$TOK" $feed --out /tmp/$b.npy >/dev/null 2>>"$L/bits.err" \
          || echo "$b $m $mode $feed failed" >>"$L/bits.err"
      done
      cmp -s /tmp/dsv4.npy /tmp/dsv4-mhcold.npy && r=same || r=DIFFERENT
      echo "bits $(basename $m) $mode ${feed:-one-shot}: fast vs old kernels $r" >>"$L/bits.log"
    done
  done
done
for r in 1 2; do for b in dsv4 dsv4-mhcold; do
  echo "== $b round $r" >>"$L/ab.log"
  timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 64 --no-bandwidth >>"$L/ab.log" 2>&1
done; done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
for b in dsv4 dsv4-mhcold; do
  [ "${NCU_RUN:-1}" = 1 ] || break
  timeout 75 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
      --csv --page raw --kernel-name "regex:^k_(embed|hc_pre|hc_post|route|moe_plan|rmsnorm)" --launch-count 1100 \
      .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 1 --decode 2 --no-bandwidth >"$L/ncu-$b.csv" 2>/dev/null
  python3 tools/gpu/ncu_summary.py "$L/ncu-$b.csv" k_embed 1 >"$L/ncu-$b.txt" 2>&1
done
echo "== suite:"; [ -f "$L/suite.log" ] && grep -E "^FAIL|passed, .* failed|suite exit" "$L/suite.log" | tail -8
echo "== bits:"; cat "$L/bits.log"; tail -3 "$L/bits.err" 2>/dev/null
echo "== A/B:"; grep -E "^==|^prefill|^decode|rror" "$L/ab.log"
for b in dsv4 dsv4-mhcold; do [ -f "$L/ncu-$b.txt" ] && { echo "== ncu $b:"; cat "$L/ncu-$b.txt"; }; done
tar czf "$OUT/mhcfast.tgz" -C /tmp mhcfast-logs
echo "total $(el) s"
