#!/usr/bin/env bash
# On the lent GPU machine (.gpu/ carried): the GPU suite, then the Flash shape (bench --synthetic flash, OFFICIAL,
# prompt 1024 as run 14) with .gpu/dsv4 and with .gpu/dsv4-old (the same tree built with one switch changed), two
# rounds each, alternating. Logs under $OUT; the lines that matter last.
. tools/gpu/env.sh
BUILD=.gpu VERBOSE=1 timeout "${SUITE_SECONDS:-240}" tests/run_gpu.sh >"$OUT/suite.log" 2>&1
echo "suite exit $? at $(el) s" >>"$OUT/suite.log"
for r in ${ROUNDS:-1 2}; do for b in dsv4 dsv4-old; do
  echo "== $b round $r" >>"$OUT/ab.log"
  timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt ${PROMPT:-1024} --decode 16 --no-bandwidth >>"$OUT/ab.log" 2>&1
done; done
echo "== suite:"; grep -E "^FAIL|passed, .* failed|suite exit" "$OUT/suite.log" | tail -6
echo "== A/B:"; grep -E "==|prefill|decode, 1|rror" "$OUT/ab.log"
