#!/usr/bin/env bash
# response_format / output_config.format together with thinking mode (issue 12): `dsv4 serve` on a tiny
# random-weight checkpoint with the V4 chat markers; at temperature 1 over several seeds, OpenAI (reasoning_effort,
# the thinking switch; json_schema and json_object, streamed and not) and Anthropic (thinking + output_config.format,
# and the beta's output_format) replies have their reasoning apart (reasoning_content / a thinking block) and an
# answer that ajv validates against the schema, or that ended with length (response_format_thinking.mjs).
# Prints "N passed, N failed".
set -u
cd "$(dirname "$0")"
BIN=${DSV4_BIN:-../../build/dsv4}
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
if [ ! -d node_modules/openai ] || [ ! -d node_modules/@anthropic-ai/sdk ] || [ ! -d node_modules/ajv ]; then
    echo "tests/node: npm dependencies missing (run 'npm ci' in tests/node)"; echo "0 passed, 1 failed"; exit 1
fi
T=$(mktemp -d /tmp/dsv4_rfthink.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT
# shellcheck source=lib.sh
. ./lib.sh
make_model || { echo "tiny model failed"; echo "0 passed, 1 failed"; exit 1; }
if start "$T/err" --max-streams 8 --threads 2; then
    node response_format_thinking.mjs "http://127.0.0.1:$PORT" "$(basename "$M")" >"$T/out" 2>&1
    rc=$?
    grep -v '^[0-9]* passed, [0-9]* failed$' "$T/out"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$T/out" | tail -1)
    if [ -n "$line" ]; then
        pass=$((pass + ${line%% passed*})); f=${line##*, }; fail=$((fail + ${f%% failed}))
        [ $rc -ne 0 ] && [ "${f%% failed}" = 0 ] && bad "response_format_thinking.mjs exit $rc"
    else
        bad "response_format_thinking.mjs crashed (exit $rc); server stderr: $(tail -20 "$T/err")"
    fi
    kill -TERM "$PID"; wait "$PID"; src=$?
    [ $src = 0 ] && ok || bad "server exit $src"
else
    bad "server"
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
