#!/usr/bin/env bash
# dsv4 render reproduces the official encoder's test cases byte for byte, and fails cleanly on bad input.
# (No npm dependency.) Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
BIN=${DSV4_BIN:-build/dsv4}
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for j in tests/data/text/chat_encoding/published_*.json; do
    want=${j%.json}.txt
    if "$BIN" render --messages "$j" > "$tmp/out" 2> "$tmp/err" && cmp -s "$tmp/out" "$want"; then ok
    else bad "$j: output differs from $(basename "$want") ($(head -c 200 "$tmp/err"))"; fi
done
# the same files through the 0731 encoder: no effort set, so the prompt is identical
for j in tests/data/text/chat_encoding/published_*.json; do
    if "$BIN" render --messages "$j" --encoder v4-0731 | cmp -s - "${j%.json}.txt"; then ok; else bad "$j with --encoder v4-0731"; fi
done
# errors: non-zero exit and exactly one stderr line
check_error() {
    if "$BIN" render "$@" > /dev/null 2> "$tmp/err"; then bad "render $* succeeded"; return; fi
    [ "$(wc -l < "$tmp/err")" = 1 ] && ok || bad "render $*: expected one stderr line, got: $(cat "$tmp/err")"
}
check_error --messages /nonexistent.json
printf '{"messages": [' > "$tmp/broken.json"; check_error --messages "$tmp/broken.json"
printf '{"messages": [{"role": "alien", "content": "x"}]}' > "$tmp/role.json"; check_error --messages "$tmp/role.json"
printf '{"messages": [{"role": "user", "content": "x"}], "mode": "thinking", "effort": "ultra"}' > "$tmp/eff.json"; check_error --messages "$tmp/eff.json"
check_error
check_error --bogus
# tokenize errors
tk=tests/data/text/tiny_tokenizer.json
if "$BIN" tokenize --tokenizer /nonexistent.json --text x > /dev/null 2> "$tmp/err"; then bad "tokenize with a missing file succeeded"; else ok; fi
if "$BIN" tokenize --tokenizer "$tk" --decode --text "1,99999999" > /dev/null 2> "$tmp/err"; then bad "decode of an out-of-range id succeeded"; else ok; fi
printf 'a\xffb' > "$tmp/bad.txt"
if "$BIN" tokenize --tokenizer "$tk" --file "$tmp/bad.txt" > /dev/null 2> "$tmp/err"; then bad "invalid UTF-8 accepted"; else ok; fi
# tokenize/decode round trip on the tiny tokenizer, --lines keeps one output line per input line
printf 'abc\n\nx<X>y é\n' > "$tmp/lines.txt"
"$BIN" tokenize --tokenizer "$tk" --file "$tmp/lines.txt" --lines > "$tmp/ids.txt" || bad "tokenize --lines failed"
[ "$(wc -l < "$tmp/ids.txt")" = 3 ] && ok || bad "--lines gave $(wc -l < "$tmp/ids.txt") lines for 3"
"$BIN" tokenize --tokenizer "$tk" --file "$tmp/ids.txt" --lines --decode > "$tmp/back.txt" || bad "decode --lines failed"
cmp -s "$tmp/lines.txt" "$tmp/back.txt" && ok || bad "decode(encode(lines)) differs"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
