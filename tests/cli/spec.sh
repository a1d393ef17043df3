#!/usr/bin/env bash
# dsv4 generate --spec ngram|self [--draft N] (issue 6): greedy ids equal --spec none for one prompt and for
# --batch (all streams verified in one step), past the window and the ratio-128 emission; self-draft reports
# 100 % acceptance; --stats prints the acceptance line; --spec mtp|dspark give plain decoding's ids; bad values end with one clean
# error line; dsv4 bench --spec --streams prints the scheduler's acceptance. Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"

"$BIN" tiny -o "$T/m" --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 \
    --set index_topk=3 >/dev/null 2>&1 || { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }

P=5,9,100,7,5,9,100,7,5,9
"$BIN" generate -m "$T/m" --tokens $P --ids -n 150 >"$T/ref" 2>/dev/null || bad "plain generate failed"
for s in ngram self; do
    for d in 1 4 15; do
        if "$BIN" generate -m "$T/m" --tokens $P --ids -n 150 --spec $s --draft $d --stats >"$T/out" 2>"$T/err"; then
            cmp -s "$T/ref" "$T/out" && ok || bad "--spec $s --draft $d: ids differ from --spec none"
            grep -q "^spec $s: draft $d, .* accepted" "$T/err" && ok || bad "--spec $s --stats: no acceptance line: $(cat "$T/err")"
            if [ $s = self ]; then grep -q "(100.0 %)" "$T/err" && ok || bad "self-draft below 100 %: $(cat "$T/err")"; fi
        else bad "--spec $s --draft $d failed: $(cat "$T/err")"; fi
    done
done
# drafts longer than the default ring slack (16): the model is loaded with more
"$BIN" generate -m "$T/m" --tokens $P --ids -n 150 --spec self --draft 40 >"$T/out" 2>"$T/err" &&
    cmp -s "$T/ref" "$T/out" && ok || bad "--spec self --draft 40: $(cat "$T/err")"

# several streams in one step
{ echo "7"; echo "1,2,3,4,5,6,7,8,9,10,11,12"; seq -s, 10 150; echo "3,3,3,3,3,3"; } >"$T/prompts"
"$BIN" generate -m "$T/m" --batch "$T/prompts" -n 60 >"$T/bref" 2>/dev/null || bad "plain --batch failed"
for s in ngram self; do
    "$BIN" generate -m "$T/m" --batch "$T/prompts" -n 60 --spec $s --draft 5 >"$T/out" 2>"$T/err" &&
        cmp -s "$T/bref" "$T/out" && ok || bad "--batch --spec $s: differs from --spec none: $(cat "$T/err")"
done

expect_err "spec mtp without a head" "no V4 MTP head" "$BIN" generate -m "$T/m" --tokens 1 --spec mtp
"$BIN" tiny -o "$T/mtp" --mtp v4 --seed 4 --set compress_ratios=[0,0,4,128,4,128] --set sliding_window=8 >/dev/null 2>&1
plain=$("$BIN" generate -m "$T/mtp" --tokens 5,6,7,8 -n 150 --ids 2>/dev/null)
mtp=$("$BIN" generate -m "$T/mtp" --tokens 5,6,7,8 -n 150 --ids --spec mtp --draft 1 2>/dev/null)
if [ -n "$plain" ] && [ "$plain" = "$mtp" ]; then pass=$((pass + 1)); else echo "FAIL spec mtp: ids differ from --spec none"; fail=$((fail + 1)); fi
expect_err "spec dspark without a head" "no DSpark drafter" "$BIN" generate -m "$T/m" --tokens 1 --spec dspark
"$BIN" tiny -o "$T/dspark" --mtp dspark --seed 4 --set compress_ratios=[0,0,4,128,4,128] --set sliding_window=8 >/dev/null 2>&1
plain=$("$BIN" generate -m "$T/dspark" --tokens 5,6,7,8 -n 150 --ids 2>/dev/null)
ds=$("$BIN" generate -m "$T/dspark" --tokens 5,6,7,8 -n 150 --ids --spec dspark --draft 5 2>/dev/null)
if [ -n "$plain" ] && [ "$plain" = "$ds" ]; then pass=$((pass + 1)); else echo "FAIL spec dspark: ids differ from --spec none"; fail=$((fail + 1)); fi
# dsv4 bench --spec with --streams: the scheduler's speculation table (every drafter a row per stream count,
# self-draft at 100 %), and a drafter the checkpoint cannot make is one error line
"$BIN" bench -m "$T/mtp" --no-bandwidth --prompt 8 --decode 16 --streams 1,3 --spec none,ngram,self,mtp >"$T/out" 2>"$T/err" \
    && ok || bad "bench --spec --streams: $(cat "$T/err")"
for d in none ngram self mtp; do
    for n in 1 3; do
        grep -qE "^ $d +$n +[0-9]+ +[0-9.]+% +[0-9.]+ +[0-9.]+ " "$T/out" && ok || bad "bench: no scheduler row for $d with $n streams: $(cat "$T/out")"
    done
done
grep -qE "^ self +3 +4 +100.0% " "$T/out" && ok || bad "bench: self-draft in the scheduler below 100 %: $(grep '^ self' "$T/out")"
expect_err "bench spec dspark without a head" "DSpark" "$BIN" bench -m "$T/m" --no-bandwidth --prompt 8 --decode 8 --streams 2 --spec dspark
expect_err "spec bad" "--spec must be" "$BIN" generate -m "$T/m" --tokens 1 --spec bogus
expect_err "draft 0" "--draft" "$BIN" generate -m "$T/m" --tokens 1 --spec ngram --draft 0
expect_err "bad token" "outside the vocabulary" "$BIN" generate -m "$T/m" --tokens 1,99999 --spec ngram

finish
