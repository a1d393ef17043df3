#!/usr/bin/env bash
# Streamed tool calls through the official npm clients: test_server writes the streams its scripted DSML reply
# gives (DSV4_SSE_DIR), tool_stream_sdk.mjs reads them with `openai` and `@anthropic-ai/sdk`.
# Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
if [ ! -d tests/node/node_modules/openai ] || [ ! -d tests/node/node_modules/@anthropic-ai/sdk ]; then
    echo "tests/node: npm dependencies missing (run 'npm ci' in tests/node)"; echo "0 passed, 1 failed"; exit 1
fi
T=$(mktemp -d /tmp/dsv4_sse.XXXXXX)
trap 'rm -rf "$T"' EXIT
if ! DSV4_SSE_DIR="$T" CMOCKA_MESSAGE_OUTPUT=stdout "$BUILD/tests/test_server" >"$T/log" 2>&1 || [ ! -s "$T/calls.json" ]; then
    echo "FAIL: test_server did not write the streams: $(tail -5 "$T/log")"; echo "0 passed, 1 failed"; exit 1
fi
node tests/node/tool_stream_sdk.mjs "$T"
