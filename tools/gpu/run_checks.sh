#!/usr/bin/env bash
# On the lent GPU machine (.gpu/ carried, tools/gpu/stage.sh; .gpu/dsv4-old optional): the correctness queue in
# one call of at most ~560 s, the slow parts in the background so that nothing waits on them:
#   background: the flash-2g checkpoint is written (CPU only; run 17's lesson: never under a short timeout) and
#               compute-sanitizer racecheck runs over test_gpu_sample (it needs minutes);
#   foreground: the GPU suite; memcheck of routed experts in host memory; serve on cuda with MTP / DSpark
#               speculation; bench --grammar on the real V4 vocabulary; then flash-2g decode, .gpu/dsv4 against
#               .gpu/dsv4-old when tools/gpu/stage_variant.sh staged one, once the checkpoint exists.
# Logs under $OUT; a short table last.
. tools/gpu/env.sh
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1

(.gpu/dsv4 bench --synthetic flash-2g --device cpu --prompt 4 --decode 2 --no-bandwidth >"$OUT/write2g.log" 2>&1
 echo "written at $(el) s" >>"$OUT/write2g.log") &
W2G=$!
(timeout 420 "$CS" --tool racecheck --error-exitcode 9 .gpu/gputests/test_gpu_sample >"$OUT/race.log" 2>&1
 echo "exit $? at $(el) s" >>"$OUT/race.log") &
RACE=$!

BUILD=.gpu VERBOSE=1 timeout 300 tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"

.gpu/dsv4 tiny -o /tmp/san --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 >/dev/null 2>&1
{
  echo "== inspect"; .gpu/dsv4 inspect -m /tmp/san --gpu-mem 0.0054 2>&1 | tail -3
  echo "== memcheck logits with host experts"
  timeout 120 "$CS" --tool memcheck --error-exitcode 9 .gpu/dsv4 logits -m /tmp/san --device cuda --mode official --gpu-mem 0.0054 \
      --tokens "$(seq -s, 3 2 300)" --chunks 7,1,64 --out /tmp/x.npy 2>&1 | tail -3
  echo "== memcheck test_gpu_host_experts"
  timeout 150 "$CS" --tool memcheck --error-exitcode 9 .gpu/gputests/test_gpu_host_experts 2>&1 | tail -3
} >"$OUT/memcheck.log" 2>&1
echo "memcheck done at $(el) s" >>"$OUT/memcheck.log"

for k in v4 dspark; do   # the speculative checkpoints are written here: the carry limit is 64 MiB
  .gpu/dsv4 tiny -o .gpu/serve-$k --seed 3 --mtp $k --tokenizer .gpu/serve-tokenizer.json --set vocab_size=271 \
      --set bos_token_id=264 --set eos_token_id=265 >/dev/null 2>&1
done
{
  for k in v4:mtp dspark:dspark; do
    echo "== serve --spec ${k#*:}"; timeout 90 python3 tools/gpu/serve_check.py .gpu/dsv4 ".gpu/serve-${k%%:*}" cuda --spec "${k#*:}"
  done
  echo "== serve --spec ngram"; timeout 90 python3 tools/gpu/serve_check.py .gpu/dsv4 .gpu/serve-model cuda --spec ngram
} >"$OUT/serve.log" 2>&1

python3 -c "import lzma; open('/tmp/v4tok.json','wb').write(lzma.open('.gpu/v4tok/tokenizer.json.xz').read())"
.gpu/dsv4 tiny -o /tmp/gm --seed 5 --tokenizer /tmp/v4tok.json --set vocab_size=129280 >/dev/null 2>&1 &&
  cp .gpu/v4tok/tokenizer_config.json /tmp/gm/
for d in cuda cpu; do echo "== bench --grammar --device $d"; timeout 60 .gpu/dsv4 bench --grammar -m /tmp/gm --device $d 2>&1 | tail -6; done >"$OUT/grammar.log" 2>&1

echo "waiting for the flash-2g checkpoint at $(el) s" >>"$OUT/ab.log"
wait $W2G
for r in 1 2; do for b in dsv4 $([ -x .gpu/dsv4-old ] && echo dsv4-old); do
  echo "== $b round $r" >>"$OUT/ab.log"
  timeout 60 .gpu/$b bench --synthetic flash-2g --device cuda --mode official --prompt 512 --decode 128 >>"$OUT/ab.log" 2>&1
done; done
wait $RACE

echo "== gpu: $(cat "$OUT/gpu.txt"), total $(el) s"
echo "== suite:"; grep -E "^FAIL|passed, .* failed|suite exit" "$OUT/suite.log" | tail -8
grep -E "host experts|relative|deviation" "$OUT/suite.log" | head -12
echo "== race:"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|exit" "$OUT/race.log" | tail -3
echo "== memcheck:"; grep -E "==|SUMMARY|rror|routed experts" "$OUT/memcheck.log" | head -12
echo "== serve:"; grep -vE "^\s*$" "$OUT/serve.log" | tail -9
echo "== grammar:"; grep -E "==|B=|rror" "$OUT/grammar.log"
echo "== A/B (decode lines):"; grep -E "==|decode, 1|bandwidth fraction|rror" "$OUT/ab.log"
