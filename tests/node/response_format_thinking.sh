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
# shellcheck source=lib.sh
. ./lib.sh
server_test_begin rfthink openai @anthropic-ai/sdk ajv
if start "$T/err" --max-streams 8 --threads 2; then
    node response_format_thinking.mjs "http://127.0.0.1:$PORT" "$(basename "$M")" >"$T/out" 2>&1
    node_counts "$T/out" "response_format_thinking.mjs" $? "$T/err"
    kill -TERM "$PID"; wait "$PID"; src=$?
    [ $src = 0 ] && ok || bad "server exit $src"
else
    bad "server"
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
