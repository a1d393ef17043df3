#!/usr/bin/env bash
# dsv4 generate --batch: every prompt line run through the continuous-batching scheduler gives exactly the
# ids of `dsv4 generate --tokens <line> --seed <S+i> --ids` run alone, whatever --max-streams and
# --step-tokens; bad input ends with one clean error line, never a signal.
# Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"

"$BIN" tiny -o "$T/m" --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 \
    --set index_topk=3 >/dev/null 2>&1 || { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }

# prompts: 1 token, past the window, past 128, a blank line (skipped), more streams than slots
{
    echo "7"
    echo "1,2,3,4,5,6,7,8,9,10,11,12"
    echo
    seq -s, 10 150
    echo "300, 301 ,302"
    seq -s, 20 29
} >"$T/prompts"
grep -v '^$' "$T/prompts" >"$T/lines"

# the reference: each line alone
i=0
: >"$T/expect"
while IFS= read -r line; do
    ids=$("$BIN" generate -m "$T/m" --tokens "$line" -n 9 --temp 0.9 --top-k 50 --seed $((11 + i)) --ids 2>"$T/err") \
        || { bad "alone $i: $(cat "$T/err")"; }
    echo "$i: $ids" >>"$T/expect"
    i=$((i + 1))
done <"$T/lines"

for cfg in "1 0" "2 5" "3 64" "16 256" "5 1"; do
    set -- $cfg
    if "$BIN" generate -m "$T/m" --batch "$T/prompts" -n 9 --temp 0.9 --top-k 50 --seed 11 \
            --max-streams "$1" --step-tokens "$2" >"$T/got" 2>"$T/err"; then
        if cmp -s "$T/got" "$T/expect"; then ok; else bad "--max-streams $1 --step-tokens $2 differs:"; diff "$T/expect" "$T/got" | head; fi
    else bad "--max-streams $1 --step-tokens $2: $(cat "$T/err")"; fi
done

# text lines use the checkpoint's tokenizer; each equals `generate -p TEXT` alone
if [ -f tests/data/text/tiny_tokenizer.json ] && "$BIN" tiny -o "$T/mt" --tokenizer tests/data/text/tiny_tokenizer.json >/dev/null 2>&1; then
    printf 'Hello world\n5,6,7\nthe quick brown fox\n' >"$T/mixed"
    {
        echo "0: $("$BIN" generate -m "$T/mt" -p "Hello world" -n 6 --temp 0.7 --seed 3 --ids)"
        echo "1: $("$BIN" generate -m "$T/mt" --tokens 5,6,7 -n 6 --temp 0.7 --seed 4 --ids)"
        echo "2: $("$BIN" generate -m "$T/mt" -p "the quick brown fox" -n 6 --temp 0.7 --seed 5 --ids)"
    } >"$T/mixed_expect"
    if "$BIN" generate -m "$T/mt" --batch "$T/mixed" -n 6 --temp 0.7 --seed 3 --max-streams 2 --step-tokens 3 >"$T/got" 2>"$T/err" \
        && cmp -s "$T/got" "$T/mixed_expect"; then ok; else bad "text prompts: $(cat "$T/err")"; diff "$T/mixed_expect" "$T/got" | head; fi
else bad "tiny --tokenizer failed"; fi

printf '1,2\nhello world\n' >"$T/text"
expect_err "text without tokenizer" "needs a tokenizer" "$BIN" generate -m "$T/m" --batch "$T/text"
printf '1,2\n3,99999\n' >"$T/badid"
expect_err "token out of vocabulary" "outside the vocabulary" "$BIN" generate -m "$T/m" --batch "$T/badid"
printf '\n\n' >"$T/empty"
expect_err "no prompts" "no prompts" "$BIN" generate -m "$T/m" --batch "$T/empty"
expect_err "missing file" "$T/nope" "$BIN" generate -m "$T/m" --batch "$T/nope"
expect_err "batch and tokens" "exactly one" "$BIN" generate -m "$T/m" --batch "$T/lines" --tokens 1,2
expect_err "zero streams" "--max-streams" "$BIN" generate -m "$T/m" --batch "$T/lines" --max-streams 0

finish
