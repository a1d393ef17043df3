#!/usr/bin/env bash
# The newcomer's first command: install, build, write a tiny synthetic checkpoint in the official DeepSeek V4
# format, and generate from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
make -j2 build/dsv4
dir=${DSV4_DEMO_DIR:-/tmp/dsv4-demo-flash-tiny}
[ -f "$dir/config.json" ] || build/dsv4 tiny -o "$dir" --preset flash-tiny --seed 1
build/dsv4 inspect -m "$dir"
echo "--- dsv4 generate (greedy, 32 tokens, EXACT mode) ---"
build/dsv4 generate -m "$dir" --tokens 0,17,42,300,5 -n 32 --ids
