#!/usr/bin/env bash
# The GPU suite (make test-gpu): every GPU test program ($BUILD/gputests/test_*, from tests/gpu/test_*.c) and
# every tests/gpu/*.sh, through the same runner and closing line as `make test`. Needs the CUDA build
# (BUILD=build-cuda) and a GPU; the programs say so in one line and pass when there is none.
cd "$(dirname "$0")/.."
export BUILD=${BUILD:-build-cuda}
export TEST_DIR="$BUILD/gputests"
export SCRIPTS="tests/gpu/*.sh"
exec tests/run_all.sh
