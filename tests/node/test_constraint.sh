#!/usr/bin/env bash
# Constrained generation validated by ajv (an independent JSON Schema implementation) on a tiny random model:
# see constraint_check.mjs. Needs `npm install` in tests/node. Prints "N passed, N failed".
set -u
cd "$(dirname "$0")"
BIN=${DSV4_BIN:-../../build/dsv4}
if [ ! -d node_modules/ajv ]; then
    echo "tests/node: npm dependencies missing (run 'npm install' in tests/node)"
    echo "0 passed, 1 failed"
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BIN" tiny -o "$tmp/m" --seed 5 --tokenizer ../data/text/tiny_tokenizer.json >/dev/null 2>&1 || { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }
node constraint_check.mjs "$BIN" "$tmp/m" ../data/constraint
