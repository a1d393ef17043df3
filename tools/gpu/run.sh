#!/usr/bin/env bash
# On the lent GPU machine (from the repository root, .gpu/ carried): the GPU suite, the sanitizers, a short
# benchmark; logs under $OUT; a short table last.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}"
export DSV4_TESTDATA="$PWD/.gpu/testdata" DSV4_ROOT="$PWD"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader >"$OUT/gpu.txt" 2>&1
t0=$(date +%s)
BUILD=.gpu tests/run_gpu.sh >"$OUT/suite.log" 2>&1
t1=$(date +%s)
# compute-sanitizer: memcheck over the kernel tests and a CLI run in both modes; racecheck on the shared-memory kernels
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
.gpu/dsv4 tiny -o /tmp/san --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 >/dev/null 2>&1
{
  echo "== memcheck kernels"; "$CS" --tool memcheck --error-exitcode 9 .gpu/gputests/test_gpu_kernels 2>&1 | tail -5
  for mode in exact official; do for kv in f32 fp8; do
    echo "== memcheck logits $mode $kv"
    "$CS" --tool memcheck --error-exitcode 9 .gpu/dsv4 logits -m /tmp/san --device cuda --mode $mode --kv $kv --tokens "$(seq -s, 3 2 300)" --chunks 7,1,64 --out /tmp/x.npy 2>&1 | tail -3
  done; done
  echo "== racecheck logits"; "$CS" --tool racecheck --error-exitcode 9 .gpu/dsv4 logits -m /tmp/san --device cuda --mode official --kv fp8 --tokens "$(seq -s, 3 2 200)" --out /tmp/x.npy 2>&1 | tail -3
  echo "== synccheck logits"; "$CS" --tool synccheck --error-exitcode 9 .gpu/dsv4 logits -m /tmp/san --device cuda --tokens "$(seq -s, 3 2 200)" --out /tmp/x.npy 2>&1 | tail -3
} >"$OUT/sanitizer.log" 2>&1
t2=$(date +%s)
.gpu/dsv4 bench -m /tmp/san --device cuda --prompt 256 --decode 64 >"$OUT/bench.log" 2>&1
echo "== gpu: $(cat "$OUT/gpu.txt")"
echo "== suite ($((t1 - t0)) s):"; grep -E "^(ok|FAIL)|passed, .* failed|skipped" "$OUT/suite.log" | tail -20
echo "== sanitizer ($((t2 - t1)) s):"; grep -E "==|ERROR SUMMARY|error" "$OUT/sanitizer.log" | head -30
echo "== bench:"; tail -8 "$OUT/bench.log"
