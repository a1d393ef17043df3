#!/usr/bin/env bash
# On the lent GPU machine (.gpu/ carried after tools/gpu/stage.sh and
#   tools/gpu/stage_variant.sh dsv4-fp4word "-DMMA_FP4_VEC=0"   (the word-wise FP4 loads of run 36)
#   tools/gpu/stage_variant.sh dsv4-fp4v1 "-DMMA_FP4_VEC=1"     (16-byte weight loads, scale bytes)
# ): the FP4 weight loads of k_mma.cu (helper fp4load, issue 18). test_gpu_mma (modes 1 and 2 = mode 0 by memcmp,
# experts = plain linear by memcmp, the exact / bound / batch-invariance checks), its expert micro-benchmark (one
# MoE layer's routed experts, 6 x (w1, w3, w2) FP4, all three modes in one binary), the linear benchmark, the same
# logits from dsv4 and dsv4-fp4word (two models whose experts take the FP4 tensor-core path), ncu over one Flash
# step (as run 36), then Flash decode with the three builds, two rounds, alternating. ~4 min. Logs under $OUT.
. tools/gpu/env.sh
for b in dsv4-fp4word dsv4-fp4v1; do [ -f .gpu/$b.xz ] && xz -dk .gpu/$b.xz; done
.gpu/gputests/test_gpu_mma >"$OUT/mma_test.log" 2>&1
echo "test_gpu_mma rc=$? at $(el) s" | tee -a "$OUT/mma_test.log"
.gpu/gputests/test_gpu_mma --bench-experts >"$OUT/bench_experts.log" 2>&1
echo "--bench-experts rc=$? at $(el) s" >>"$OUT/bench_experts.log"
.gpu/gputests/test_gpu_mma --bench >"$OUT/mma_bench.log" 2>&1
echo "--bench rc=$? at $(el) s" >>"$OUT/mma_bench.log"
W=/tmp/wide
.gpu/dsv4 tiny -o $W --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 \
    --set hidden_size=1024 --set q_lora_rank=1024 --set moe_intermediate_size=1024 --set o_lora_rank=512 >/dev/null 2>&1
TOK=$(awk 'BEGIN{for(i=0;i<300;i++) printf "%s%d", (i?",":""), (i*37+3)%260}')
for m in $W .gpu/testdata/official_calm/calmpro/checkpoint; do
  for b in dsv4 dsv4-fp4word; do .gpu/$b logits -m $m --device cuda --mode official --kv fp8 --tokens "$TOK" --out /tmp/$b.npy >/dev/null 2>&1; done
  cmp -s /tmp/dsv4.npy /tmp/dsv4-fp4word.npy && r=same || r=DIFFERENT
  echo "bits $(basename $m): FP4 vector loads vs word loads $r" >>"$OUT/bits.log"
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
timeout 75 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    --csv --page raw --kernel-name "regex:^k_([^f]|f[^i])" --launch-count 1400 \
    .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 1 --decode 1 --no-bandwidth >"$OUT/ncu.csv" 2>/dev/null
python3 tools/gpu/ncu_summary.py "$OUT/ncu.csv" k_embed 0 >"$OUT/ncu.txt" 2>&1
for r in 1 2; do for b in dsv4 dsv4-fp4word dsv4-fp4v1; do
  [ -x .gpu/$b ] || continue
  echo "== $b round $r" >>"$OUT/ab.log"
  timeout 120 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt ${PROMPT:-256} --decode 32 --no-bandwidth >>"$OUT/ab.log" 2>&1
done; done
grep -E "FP4|experts|PASSED|FAILED|rc=" "$OUT/mma_test.log" | tail -20
cat "$OUT/bench_experts.log"
grep -E "^FP4|^FP8" "$OUT/mma_bench.log" | grep -E " (1|8) " 
echo "== bits:"; cat "$OUT/bits.log"
echo "== ncu (dsv4, one step; run 36: k_mma_expert 24 % of 13.6 ms at 824-963 GB/s):"; grep -E "step =|k_mma" "$OUT/ncu.txt"
echo "== A/B:"; grep -E "==|decode, 1|rror" "$OUT/ab.log"
