#!/usr/bin/env bash
# The chat page of `dsv4 serve` (GET /) in a real headless browser: Debian's chromium driven by playwright-core
# from npm (chat_page.mjs): it loads, sends a message, renders the streamed reply, stops a stream, shows the
# reasoning folded. CHROMIUM=PATH picks the browser (default: chromium-headless-shell, else chromium).
# Prints "N passed, N failed".
set -u
cd "$(dirname "$0")"
BIN=${DSV4_BIN:-../../build/dsv4}
CHROMIUM=${CHROMIUM:-$(command -v chromium-headless-shell || command -v chromium || true)}
if [ -z "$CHROMIUM" ] || [ ! -d node_modules/playwright-core ]; then
    echo "tests/node/chat_page.sh: needs Debian's chromium-headless-shell (or chromium) and npm playwright-core" \
         "(scripts/install-deps.sh installs both)"
    echo "0 passed, 1 failed"; exit 1
fi
# shellcheck source=lib.sh
. ./lib.sh
server_test_begin page
if start "$T/err" --max-streams 4 --threads 2; then
    node chat_page.mjs "http://127.0.0.1:$PORT" "$CHROMIUM" "$(basename "$M")" >"$T/out" 2>&1
    node_counts "$T/out" "chat_page.mjs" $? "$T/err"
    kill -TERM "$PID"; wait "$PID"; src=$?
    [ $src = 0 ] && ok || bad "server exit $src"
else
    bad "server did not start"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
