#!/usr/bin/env bash
# Runs every test program (build/tests/test_*) and every script test (tests/cli/*.sh, tests/node/*.sh)
# and prints the closing line "N passed, N failed". cmocka programs report their own counts; a script
# counts as one test (exit 0 = passed) unless it prints its own "N passed, N failed" line.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export DSV4_BIN="$PWD/$BUILD/dsv4"
export DSV4_ROOT="$PWD"
export CMOCKA_MESSAGE_OUTPUT=stdout
passed=0; failed=0; failed_names=()
log=$(mktemp)
run_one() {
    local name=$1; shift
    local t0=$(date +%s)
    "$@" >"$log" 2>&1
    local rc=$?
    local p f
    p=$(grep -aoE '^\[  PASSED  \] [0-9]+ test' "$log" | awk '{s+=$4} END{print s+0}')
    f=$(grep -aoE '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$4} END{print s+0}')
    if [ "$p" = 0 ] && [ "$f" = 0 ]; then
        local line
        line=$(grep -aE '^([A-Za-z]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
        if [ -n "$line" ]; then
            p=$(echo "$line" | sed -E 's/^([A-Za-z]+: )?([0-9]+) passed.*/\2/')
            f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
        elif [ $rc = 0 ]; then p=1; else f=1; fi
    fi
    if [ $rc != 0 ] && [ "$f" = 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f))
    local dt=$(( $(date +%s) - t0 ))
    if [ "$f" != 0 ]; then
        failed_names+=("$name")
        echo "FAIL $name (${dt}s)"; sed 's/^/    /' "$log" | tail -60
    else
        echo "ok   $name: $p passed (${dt}s)"
        [ -n "${VERBOSE:-}" ] && grep -av '^\[' "$log" | sed 's/^/    /'
    fi
}
# TEST_DIR / SCRIPTS: which programs and scripts (tests/run_gpu.sh points them at the GPU suite)
TEST_DIR=${TEST_DIR:-$BUILD/tests}
SCRIPTS=${SCRIPTS:-"tests/cli/*.sh tests/node/*.sh"}
for t in "$TEST_DIR"/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for t in $SCRIPTS; do
    [ -f "$t" ] || continue
    [ "$(basename "$t")" = lib.sh ] && continue   # sourced by the others
    run_one "$t" bash "$t"
done
rm -f "$log"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
