#!/usr/bin/env bash
# On a lent machine with 2+ GPUs (from the repository root, .gpu/ carried): expert parallelism (issue 16) — the
# EP test program, the whole GPU suite, a sanitizer pass over a 2-GPU run, and flash-2g on 1 and 2 GPUs (bench and
# logits compared byte for byte); logs under $OUT, a short table last. memcheck runs with --report-api-errors no:
# NCCL probes kernels of other architectures with cudaFuncGetAttributes, which fails by design (GPU_RUNS run 11).
. tools/gpu/env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${DSV4_NCCL:-}" ] && ! ls /usr/local/cuda/lib64/libnccl.so.2 >/dev/null 2>&1; then
  DSV4_NCCL=$(find / -name 'libnccl.so.2' 2>/dev/null | head -1); export DSV4_NCCL
fi
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader; nvidia-smi topo -m; \
  echo "nccl: ${DSV4_NCCL:-/usr/local/cuda/lib64/libnccl.so.2}"; } >"$OUT/gpu.txt" 2>&1
t0=$(date +%s)
.gpu/gputests/test_gpu_ep >"$OUT/ep.log" 2>&1
t1=$(date +%s)
BUILD=.gpu VERBOSE=1 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
t2=$(date +%s)
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
.gpu/dsv4 tiny -o /tmp/san --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 >/dev/null 2>&1
{ for mode in exact official; do
    echo "== memcheck logits --gpus 2 $mode"
    "$CS" --tool memcheck --report-api-errors no --error-exitcode 9 .gpu/dsv4 logits -m /tmp/san --device cuda --gpus 2 --mode $mode --tokens "$(seq -s, 3 2 300)" --chunks 7,1,64 --out /tmp/x.npy 2>&1 | tail -3
  done; } >"$OUT/sanitizer.log" 2>&1
t3=$(date +%s)
G=/tmp/dsv4-synthetic-flash-2g
for n in 1 2; do for mode in exact official; do
  echo "== --gpus $n $mode" >>"$OUT/bench2g.log"
  .gpu/dsv4 bench --synthetic flash-2g --device cuda --gpus $n --mode $mode --prompt 512 --decode 64 --streams 1,8,32 >>"$OUT/bench2g.log" 2>&1
done; done
TOK=$(seq -s, 7 13 2600)
for mode in exact official; do
  .gpu/dsv4 logits -m $G --device cuda --gpus 1 --mode $mode --tokens "$TOK" --chunks 100,1,1,37 --out /tmp/g1.npy 2>>"$OUT/bench2g.log"
  .gpu/dsv4 logits -m $G --device cuda --gpus 2 --mode $mode --tokens "$TOK" --chunks 100,1,1,37 --out /tmp/g2.npy 2>>"$OUT/bench2g.log"
  if cmp -s /tmp/g1.npy /tmp/g2.npy; then echo "flash-2g $mode: 2-GPU logits byte-identical to 1 GPU (200 positions)"; \
  else echo "flash-2g $mode: 2-GPU logits DIFFER from 1 GPU"; fi >>"$OUT/bench2g.log"
done
echo "== gpus: $(head -3 "$OUT/gpu.txt")"
echo "== ep test ($((t1 - t0)) s):"; grep -E "OK|FAIL|PASSED|FAILED|skipped|error|GPU 1" "$OUT/ep.log" | tail -14
echo "== suite ($((t2 - t1)) s):"; grep -E "passed, .* failed|FAIL" "$OUT/suite.log" | tail -8
echo "== sanitizer ($((t3 - t2)) s):"; grep -E "==|ERROR SUMMARY" "$OUT/sanitizer.log"
echo "== flash-2g:"; grep -E "^==|decode, 1|GPU [01]:|streams|fraction|identical|DIFFER|error" "$OUT/bench2g.log"
