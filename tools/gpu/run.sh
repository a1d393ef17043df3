#!/usr/bin/env bash
# On the lent GPU machine (from the repository root, .gpu/ carried): the GPU suite, the sanitizers, a short
# benchmark; logs under $OUT; a short table last.
. tools/gpu/env.sh
# FUZZ_SECONDS=N (with .fuzz/ carried, tools/gpu/fuzz_stage.sh): every fuzz target in the background on
# FUZZ_CORES (12) of the 16 cores for at most N seconds, stopped when this job ends; its one result file is
# $OUT/fuzz.tgz (the 8th file here: the device tool brings back at most 8). Leave N + 110 s inside the call.
if [ -n "${FUZZ_SECONDS:-}" ]; then OUT="$OUT" tools/gpu/fuzz_bg.sh start "$FUZZ_SECONDS" "${FUZZ_CORES:-12}"; fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader >"$OUT/gpu.txt" 2>&1
t0=$(date +%s)
BUILD=.gpu VERBOSE=1 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
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
  # the sampler and DSpark kernels (shared-memory reductions, one block per row)
  for t in test_gpu_sample test_gpu_dspark; do
    echo "== memcheck $t"; timeout 80 "$CS" --tool memcheck --error-exitcode 9 .gpu/gputests/$t 2>&1 | tail -3
  done
  # routed experts in host memory (issue 15): the page-locked copies, the scatter and the host rows under memcheck
  echo "== memcheck logits with host experts"
  .gpu/dsv4 inspect -m /tmp/san --gpu-mem 0.0054 2>&1 | tail -2
  "$CS" --tool memcheck --error-exitcode 9 .gpu/dsv4 logits -m /tmp/san --device cuda --mode official --gpu-mem 0.0054 --tokens "$(seq -s, 3 2 300)" --chunks 7,1,64 --out /tmp/x.npy 2>&1 | tail -3
  echo "== memcheck test_gpu_host_experts"; timeout 300 "$CS" --tool memcheck --error-exitcode 9 .gpu/gputests/test_gpu_host_experts 2>&1 | tail -3
  # run 16's racecheck of the sampler did not finish in 80 s: give it RACE_SECONDS (default 300)
  echo "== racecheck test_gpu_sample"; timeout "${RACE_SECONDS:-300}" "$CS" --tool racecheck --error-exitcode 9 .gpu/gputests/test_gpu_sample 2>&1 | tail -3
  echo "== racecheck logits"; "$CS" --tool racecheck --error-exitcode 9 .gpu/dsv4 logits -m /tmp/san --device cuda --mode official --kv fp8 --tokens "$(seq -s, 3 2 200)" --out /tmp/x.npy 2>&1 | tail -3
  echo "== synccheck logits"; "$CS" --tool synccheck --error-exitcode 9 .gpu/dsv4 logits -m /tmp/san --device cuda --tokens "$(seq -s, 3 2 200)" --out /tmp/x.npy 2>&1 | tail -3
} >"$OUT/sanitizer.log" 2>&1
t2=$(date +%s)
python3 tools/gpu/serve_check.py .gpu/dsv4 .gpu/serve-model >"$OUT/serve.log" 2>&1
.gpu/dsv4 bench -m /tmp/san --device cuda --prompt 256 --decode 64 >"$OUT/bench.log" 2>&1
# a model of real attention shapes (head_dim 512, 16 heads, 64 experts, 2.3 GB): GPU against CPU, then speed
G=/tmp/dsv4-synthetic-flash-2g
for mode in exact official; do
  .gpu/dsv4 bench --synthetic flash-2g --device cuda --mode $mode --prompt 512 --decode 64 >>"$OUT/bench2g.log" 2>&1
done
.gpu/dsv4 bench --synthetic flash-2g --device cuda --mode official --prompt 512 --decode 32 --profile >"$OUT/profile.log" 2>&1
TOK=$(seq -s, 7 13 2600)
.gpu/dsv4 logits -m $G --device cpu --tokens "$TOK" --out /tmp/c.npy 2>>"$OUT/bench2g.log"
.gpu/dsv4 logits -m $G --device cuda --tokens "$TOK" --out /tmp/g.npy 2>>"$OUT/bench2g.log"
python3 -c "
import numpy as np; c=np.load('/tmp/c.npy'); g=np.load('/tmp/g.npy')
r=np.abs(c-g).max(1)/np.abs(c).max(1); print('flash-2g EXACT, %d positions: GPU vs CPU worst relative %.3g, argmax agree %.1f%%'%(len(c), r.max(), 100*(c.argmax(1)==g.argmax(1)).mean()))
" >>"$OUT/bench2g.log" 2>&1
echo "== gpu: $(cat "$OUT/gpu.txt")"
echo "== suite ($((t1 - t0)) s):"; grep -E "^(ok|FAIL)|passed, .* failed|skipped" "$OUT/suite.log" | tail -20
grep -E "relative|mean .dlogit|worst" "$OUT/suite.log" | head -30
echo "== sanitizer ($((t2 - t1)) s):"; grep -E "==|ERROR SUMMARY|error" "$OUT/sanitizer.log" | head -30
echo "== serve:"; tail -3 "$OUT/serve.log"
echo "== bench:"; tail -4 "$OUT/bench.log"
echo "== profile:"; grep -E "ms/step|prefill of|decode," "$OUT/profile.log"
echo "== flash-2g:"; grep -E "prefill|decode|fraction|GPU vs CPU|error" "$OUT/bench2g.log"
if [ -n "${FUZZ_SECONDS:-}" ]; then echo "== fuzz:"; OUT="$OUT" tools/gpu/fuzz_bg.sh stop; fi
