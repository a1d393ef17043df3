#!/usr/bin/env bash
# Install what dsv4 needs to build and test, from Debian packages (and npm for the tokenizer tests).
# Safe to run again: apt and npm skip what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# clang + libclang-rt-dev (clang-14 and its runtimes on bookworm): libFuzzer and the sanitizers for make fuzz;
# libmicrohttpd-dev: the HTTP layer of dsv4 serve; curl: its tests; chromium-headless-shell: the chat page's
# browser test (tests/node/chat_page.sh, driven by npm playwright-core; the headless build, no desktop browser)
pkgs="build-essential pkg-config libjansson-dev libpcre2-dev libcmocka-dev libxxhash-dev libmicrohttpd-dev clang libclang-rt-dev curl chromium-headless-shell nodejs npm"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# node/npm may come from elsewhere on this machine; only ask apt for them when absent
command -v node >/dev/null && missing=$(echo "$missing" | sed 's/ nodejs//')
command -v npm >/dev/null && missing=$(echo "$missing" | sed 's/ npm//')
if [ -n "$missing" ]; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq $missing >/dev/null
fi
if [ -f tests/node/package.json ] && { [ ! -d tests/node/node_modules/@huggingface/tokenizers ] || [ ! -d tests/node/node_modules/ajv ] ||
    [ ! -d tests/node/node_modules/openai ] || [ ! -d tests/node/node_modules/@anthropic-ai/sdk ] ||
    [ ! -d tests/node/node_modules/playwright-core ]; }; then
    (cd tests/node && { npm ci --no-audit --no-fund --loglevel=error || npm install --no-audit --no-fund --loglevel=error; })
fi
