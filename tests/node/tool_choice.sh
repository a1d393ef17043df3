#!/usr/bin/env bash
# tool_choice as a guarantee (issues 12 and 13): `dsv4 serve` on a tiny random-weight checkpoint whose tokenizer
# has the V4 chat markers; for many seeds at temperature 1, every reply to tool_choice required / a named function
# (OpenAI) and any / tool (Anthropic) is a tool call whose arguments ajv validates against the tool's schema, and
# auto with strict tools gives text or valid calls (tool_choice_check.mjs). Prints "N passed, N failed".
set -u
cd "$(dirname "$0")"
BIN=${DSV4_BIN:-../../build/dsv4}
if [ ! -d node_modules/openai ] || [ ! -d node_modules/@anthropic-ai/sdk ] || [ ! -d node_modules/ajv ]; then
    echo "tests/node: npm dependencies missing (run 'npm ci' in tests/node)"; echo "0 passed, 1 failed"; exit 1
fi
T=$(mktemp -d /tmp/dsv4_tools.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
# the tiny tokenizer + the V4 chat markers as ids 264..270 (as tests/node/serve.sh builds it)
node -e '
const fs = require("fs");
const t = JSON.parse(fs.readFileSync("../data/text/tiny_tokenizer.json", "utf8"));
const marks = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"];
marks.forEach((c, i) => t.added_tokens.push({id: 264 + i, content: c, single_word: false, lstrip: false,
                                             rstrip: false, normalized: false, special: true}));
fs.writeFileSync(process.argv[1], JSON.stringify(t));' "$T/tokenizer.json" || { echo "node failed"; echo "0 passed, 1 failed"; exit 1; }
M="$T/m"
"$BIN" tiny -o "$M" --seed 5 --tokenizer "$T/tokenizer.json" --set vocab_size=271 --set bos_token_id=264 \
    --set eos_token_id=265 >/dev/null 2>&1 || { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }
: >"$T/err"   # before the server's shell opens it: the loop below reads it at once
"$BIN" serve -m "$M" --port 0 --max-streams 8 --threads 2 2>"$T/err" &
PID=$!
PORT=
for _ in $(seq 300); do
    PORT=$(sed -n 's|^dsv4: listening on http://127\.0\.0\.1:\([0-9][0-9]*\)$|\1|p' "$T/err" | head -1)
    [ -n "$PORT" ] && break
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "server did not start: $(cat "$T/err")"; echo "0 passed, 1 failed"; exit 1; }
node tool_choice_check.mjs "http://127.0.0.1:$PORT" "$(basename "$M")"
rc=$?
kill -TERM "$PID"; wait "$PID"; PID=
exit $rc
