#!/usr/bin/env bash
# Requests/s and time to first token of `dsv4 serve` at 1, 16 and 64 concurrent clients, on the tiny test
# checkpoint (tests/node/serve.sh builds the same one), CPU. Prints a Markdown table. Measures, never asserts.
# usage: tools/bench/serve_bench.sh [CLIENTS=1,16,64] [REQUESTS_PER_LEVEL=128] [MAX_TOKENS=32]   (after `make`)
set -eu
cd "$(dirname "$0")/../.."
BIN=${DSV4_BIN:-build/dsv4}
T=$(mktemp -d /tmp/dsv4_serve_bench.XXXXXX)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$T"' EXIT
node -e '
const fs = require("fs");
const t = JSON.parse(fs.readFileSync("tests/data/text/tiny_tokenizer.json", "utf8"));
const marks = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"];
marks.forEach((c, i) => t.added_tokens.push({id: 264 + i, content: c, single_word: false, lstrip: false,
                                             rstrip: false, normalized: false, special: true}));
fs.writeFileSync(process.argv[1], JSON.stringify(t));' "$T/tokenizer.json"
"$BIN" tiny -o "$T/m" --seed 3 --tokenizer "$T/tokenizer.json" --set vocab_size=271 --set bos_token_id=264 \
    --set eos_token_id=265 >/dev/null 2>&1
"$BIN" serve -m "$T/m" --port 0 --max-streams 64 --max-queue 1024 ${SERVE_ARGS:-} 2>"$T/err" &
PID=$!
for _ in $(seq 300); do grep -q listening "$T/err" && break; sleep 0.1; done
PORT=$(sed -n 's|.*:\([0-9]*\)$|\1|p' "$T/err" | head -1)
echo "$(nproc) CPUs; tiny model (flash-tiny, vocab 271); max_tokens ${3:-32}; --max-streams 64"
node tools/bench/serve_bench.mjs "http://127.0.0.1:$PORT" m "${1:-1,16,64}" "${2:-128}" "${3:-32}"
