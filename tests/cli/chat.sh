#!/usr/bin/env bash
# `dsv4 chat` (issue 7): a tiny checkpoint shipped with a tokenizer (`dsv4 tiny --tokenizer`), piped multi-turn
# chats with /think /nothink /reset /quit, one sequence across turns (positions from --stats), determinism,
# Ctrl-C during a reply and twice at the prompt, and one-line errors.
# The tokenizer is tests/data/text/tiny_tokenizer.json plus the V4 chat markers as added tokens (ids 264..270),
# so a 512-row tiny model can represent every token of the chat format.
# Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"
CHAT_PID=
trap '[ -n "$CHAT_PID" ] && kill "$CHAT_PID" 2>/dev/null; rm -rf "$T"' EXIT

node -e '
const fs = require("fs");
const t = JSON.parse(fs.readFileSync("tests/data/text/tiny_tokenizer.json", "utf8"));
const marks = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"];
marks.forEach((c, i) => t.added_tokens.push({id: 264 + i, content: c, single_word: false, lstrip: false,
                                             rstrip: false, normalized: false, special: true}));
fs.writeFileSync(process.argv[1], JSON.stringify(t));' "$T/tokenizer.json" || { echo "node failed"; echo "0 passed, 1 failed"; exit 1; }

# ---- dsv4 tiny --tokenizer ----
expect_err "tokenizer larger than vocab" "vocab_size" "$BIN" tiny -o "$T/small" --tokenizer "$T/tokenizer.json" --set vocab_size=100
if "$BIN" tiny -o "$T/m" --seed 1 --tokenizer "$T/tokenizer.json" 2>"$T/err" && cmp -s "$T/tokenizer.json" "$T/m/tokenizer.json"
then ok; else bad "tiny --tokenizer: $(cat "$T/err")"; fi
mkdir -p "$T/tokdir" && cp "$T/tokenizer.json" "$T/tokdir/" && echo '{"add_bos_token": false}' >"$T/tokdir/tokenizer_config.json"
if "$BIN" tiny -o "$T/m2" --seed 1 --tokenizer "$T/tokdir" 2>"$T/err" && [ -f "$T/m2/tokenizer_config.json" ]
then ok; else bad "tiny --tokenizer DIR with a config: $(cat "$T/err")"; fi
"$BIN" tiny -o "$T/notok" --seed 1 2>/dev/null

# ---- piped multi-turn chats ----
TURNS=$'hello there\n/think\nwhat is abc?\n/nothink\nok then\n/reset\nagain\n/quit\nnever read\n'
chat() { printf '%s' "$TURNS" | "$BIN" chat -m "$T/m" -n 12 --stats "$@"; }
if chat --temp 0.8 --seed 7 --system "Be brief." >"$T/o1" 2>"$T/e1"; then ok; else bad "chat exit $?: $(tail -2 "$T/e1")"; fi
# four replies (the line after /quit is never read), numbered in order
if [ "$(grep -c '^\[turn [0-9]*: ' "$T/e1")" = 4 ] && grep -q '^\[turn 4: ' "$T/e1"; then ok
else bad "expected 4 turns: $(cat "$T/e1")"; fi
grep -q '^\[thinking mode\]' "$T/e1" && grep -q '^\[chat mode\]' "$T/e1" && grep -q '^\[new conversation\]' "$T/e1" \
    && ok || bad "commands not acknowledged: $(cat "$T/e1")"
[ -s "$T/o1" ] && [ "$(wc -l <"$T/o1")" -ge 4 ] && ok || bad "no reply text on stdout"
# one sequence: positions grow across turns 1-3 (nothing re-prefilled means each turn adds to the last), and
# /reset starts again from an empty sequence
pos() { sed -n "s/^\[turn $1: .*position \([0-9]*\)\]/\1/p" "$T/e1"; }
p1=$(pos 1); p2=$(pos 2); p3=$(pos 3); p4=$(pos 4)
if [ -n "$p1" ] && [ "$p1" -lt "$p2" ] && [ "$p2" -lt "$p3" ] && [ "$p4" -lt "$p3" ]; then ok
else bad "positions $p1 $p2 $p3 / after reset $p4"; fi
# turn 2 adds exactly: its user part + reply tokens + closing tokens; check it is at least user + reply
n2=$(sed -n 's/^\[turn 2: \([0-9]*\) tokens.*/\1/p' "$T/e1")
[ "$((p2 - p1))" -gt "$n2" ] && ok || bad "turn 2 grew by $((p2 - p1)) for a reply of $n2 tokens"
# determinism: the same seed gives the same transcript
chat --temp 0.8 --seed 7 --system "Be brief." >"$T/o2" 2>"$T/e2"
cmp -s "$T/o1" "$T/o2" && cmp -s "$T/e1" "$T/e2" && ok || bad "same seed, different transcript"
# greedy works too, with the official numerics
if chat --mode official >"$T/o3" 2>"$T/e3" && grep -q '^\[turn 4: ' "$T/e3"; then ok; else bad "greedy official: $(tail -2 "$T/e3")"; fi
# EOF without /quit ends cleanly
if printf 'one\ntwo' | "$BIN" chat -m "$T/m" -n 4 --stats >/dev/null 2>"$T/e4" && grep -q '^\[turn 2: ' "$T/e4"; then ok
else bad "EOF: $(cat "$T/e4")"; fi

# ---- Ctrl-C ----
# during a reply: a long user line keeps the engine busy in its prefill; the interrupt closes that turn (zero or
# more tokens kept) and the chat goes on with the next line
mkfifo "$T/in"
python3 -c "print('abc d ' * 300)" >"$T/long.txt" 2>/dev/null || awk 'BEGIN{for(i=0;i<300;i++) printf "abc d "; print ""}' >"$T/long.txt"
"$BIN" chat -m "$T/m" -n 100000 --stats <"$T/in" >"$T/o5" 2>"$T/e5" &
CHAT_PID=$!
exec 3>"$T/in"
cat "$T/long.txt" >&3
sleep 0.3
kill -INT "$CHAT_PID"
printf 'next\n' >&3
for _ in $(seq 900); do grep -q '^\[turn 2: ' "$T/e5" && break; sleep 0.1; done
# at the prompt: the first Ctrl-C only warns, the second exits with status 0
kill -INT "$CHAT_PID"; sleep 0.3
alive=0; kill -0 "$CHAT_PID" 2>/dev/null && alive=1
kill -INT "$CHAT_PID"
wait "$CHAT_PID"; rc=$?
CHAT_PID=
exec 3>&-
grep -q '^\[reply interrupted\]' "$T/e5" && ok || bad "Ctrl-C during a reply not reported: $(cat "$T/e5")"
grep -q '^\[turn 2: ' "$T/e5" && ok || bad "no turn after the interrupted one: $(cat "$T/e5")"
[ $alive = 1 ] && grep -qF 'Ctrl-C again' "$T/e5" && ok || bad "first Ctrl-C at the prompt should only warn"
[ -n "${VERBOSE:-}" ] && cat "$T/e5"
[ $rc = 0 ] && ok || bad "second Ctrl-C at the prompt: exit $rc"

# ---- errors ----
expect_err "no tokenizer" "tokenizer" "$BIN" chat -m "$T/notok"
expect_err "no model" "chat" "$BIN" chat -m "$T/nope"
expect_err "missing -m" "-m" "$BIN" chat
expect_err "bad option" "--bogus" "$BIN" chat -m "$T/m" --bogus
expect_err "bad mode" "--mode" "$BIN" chat -m "$T/m" --mode fast
cp -r "$T/notok" "$T/plaintok" && cp tests/data/text/tiny_tokenizer.json "$T/plaintok/tokenizer.json"
expect_err "tokenizer without chat markers" "cannot encode V4 chats" "$BIN" chat -m "$T/plaintok"

# ---- prefix cache: a second process with the same conversation reuses the stored states (same transcript) ----
conv=$'hello there\nhow are you\n/quit'
a=$(printf '%s\n' "$conv" | "$BIN" chat -m "$T/m" -n 6 --seed 3 --prefix-cache-dir "$T/pc" --stats 2>"$T/pc1")
b=$(printf '%s\n' "$conv" | "$BIN" chat -m "$T/m" -n 6 --seed 3 --prefix-cache-dir "$T/pc" --stats 2>"$T/pc2")
c=$(printf '%s\n' "$conv" | "$BIN" chat -m "$T/m" -n 6 --seed 3 2>/dev/null)
if [ "$a" = "$c" ] && [ "$b" = "$c" ]; then ok; else bad "chat with a prefix cache changed the transcript"; fi
if grep -q "disk write" "$T/pc1" && grep -Eq "[1-9][0-9]* disk hit" "$T/pc2"; then ok; else bad "no disk reuse: $(cat "$T/pc2")"; fi
finish
