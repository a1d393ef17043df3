#!/usr/bin/env bash
# dsv4 generate --json-schema FILE | --json | --grammar FILE (issue 13): greedy ids equal with --spec ngram|self
# and through --batch (each line equals its single run); the output completes within -n tokens; bad schemas,
# grammars and option combinations end with one clean error line. Run from the repository root with DSV4_BIN
# set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"
D=tests/data/constraint

"$BIN" tiny -o "$T/m" --seed 3 --tokenizer tests/data/text/tiny_tokenizer.json >/dev/null 2>&1 ||
    { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }

for c in "--json-schema $D/person.json" "--json-schema $D/tree.json" "--json" "--grammar $D/answer.gbnf"; do
    # shellcheck disable=SC2086
    if "$BIN" generate -m "$T/m" --tokens 5,6,7 -n 100 --ids $c >"$T/ref" 2>"$T/err"; then
        ok
        # the last id is EOS (1 in the tiny model): the value completed within the budget
        [ "$(tr ',' '\n' <"$T/ref" | tail -1)" = 1 ] && ok || bad "$c: no EOS at the end: $(cat "$T/ref")"
        for s in ngram self; do
            # shellcheck disable=SC2086
            "$BIN" generate -m "$T/m" --tokens 5,6,7 -n 100 --ids $c --spec $s --draft 4 >"$T/out" 2>"$T/err" &&
                cmp -s "$T/ref" "$T/out" && ok || bad "$c --spec $s: ids differ from plain: $(cat "$T/err")"
        done
    else bad "$c: $(cat "$T/err")"; fi
done

# --batch: every line as its own run (line i has seed S + i)
printf '5,6,7\n9,9\n1,2,3,4\n' >"$T/prompts"
"$BIN" generate -m "$T/m" --batch "$T/prompts" -n 60 --temp 1 --seed 4 --json-schema $D/mixed.json >"$T/batch" 2>"$T/err" && ok ||
    bad "--batch: $(cat "$T/err")"
i=0
while read -r line; do
    "$BIN" generate -m "$T/m" --tokens "$line" -n 60 --temp 1 --seed $((4 + i)) --ids --json-schema $D/mixed.json >"$T/one" 2>/dev/null
    [ "$i: $(cat "$T/one")" = "$(sed -n "$((i + 1))p" "$T/batch")" ] && ok || bad "--batch line $i differs from its single run"
    i=$((i + 1))
done <"$T/prompts"

# text output: the value only (no EOS text), then a newline
"$BIN" generate -m "$T/m" --tokens 5,6,7 -n 40 --grammar $D/answer.gbnf >"$T/out" 2>"$T/err" &&
    grep -qE '^(yes|no|maybe), score ([1-9][0-9]?|100)\.$' "$T/out" && ok || bad "grammar text: $(cat "$T/out" "$T/err")"

printf '{"type":"string","format":"email"}' >"$T/fmt.json"
expect_err "unsupported keyword" 'unsupported keyword "format"' "$BIN" generate -m "$T/m" --tokens 1 --json-schema "$T/fmt.json"
printf '{"type":"object",' >"$T/broken.json"
expect_err "malformed schema" "not JSON" "$BIN" generate -m "$T/m" --tokens 1 --json-schema "$T/broken.json"
printf '{"properties":{"a":{"type":"number","maximum":3}}}' >"$T/num.json"
expect_err "number bounds" "#/properties/a" "$BIN" generate -m "$T/m" --tokens 1 --json-schema "$T/num.json"
printf 'root ::= root "x" | "y"\n' >"$T/left.gbnf"
expect_err "left recursion" "left-recursive" "$BIN" generate -m "$T/m" --tokens 1 --grammar "$T/left.gbnf"
printf 'root ::= "a" b\n' >"$T/undef.gbnf"
expect_err "undefined rule" "'b' is used but never defined" "$BIN" generate -m "$T/m" --tokens 1 --grammar "$T/undef.gbnf"
printf 'root ::= "a"\n\nb ::= [z-a]\n' >"$T/range.gbnf"
expect_err "grammar line" "line 3" "$BIN" generate -m "$T/m" --tokens 1 --grammar "$T/range.gbnf"
expect_err "missing file" "$T/nope.json" "$BIN" generate -m "$T/m" --tokens 1 --json-schema "$T/nope.json"
expect_err "two forms" "at most one of" "$BIN" generate -m "$T/m" --tokens 1 --json --grammar "$T/left.gbnf"
expect_err "ws alone" "--json-ws needs" "$BIN" generate -m "$T/m" --tokens 1 --json-ws 2
expect_err "ws range" "--json-ws" "$BIN" generate -m "$T/m" --tokens 1 --json --json-ws 99
"$BIN" tiny -o "$T/notok" --seed 3 >/dev/null 2>&1
expect_err "no tokenizer" "needs the checkpoint's tokenizer" "$BIN" generate -m "$T/notok" --tokens 1 --json --ids

finish
