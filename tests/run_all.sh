#!/usr/bin/env bash
# Runs every test program (build/tests/test_*) and every script test (tests/cli/*.sh, tests/node/*.sh)
# and prints the closing line "N passed, N failed". cmocka programs report their own counts; a script
# counts as one test (exit 0 = passed) unless it prints its own "N passed, N failed" line.
#
# JOBS tests run at once (default: the number of online CPUs, at most 4), each into its own log; the results are
# printed in the fixed order below whatever order they finish in, so two runs read the same.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export DSV4_BIN="$PWD/$BUILD/dsv4"
export DSV4_ROOT="$PWD"
export CMOCKA_MESSAGE_OUTPUT=stdout
JOBS=${JOBS:-$(n=$(nproc 2>/dev/null || echo 2); [ "$n" -gt 4 ] && n=4; echo "$n")}
passed=0; failed=0; failed_names=()
# TEST_LOG_DIR: keep each test's log (<i>.log, .rc, .dt) there instead of a temporary folder removed at the end
if [ -n "${TEST_LOG_DIR:-}" ]; then work=$TEST_LOG_DIR && mkdir -p "$work"
else work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT; fi

# TEST_DIR / SCRIPTS: which programs and scripts (tests/run_gpu.sh points them at the GPU suite)
TEST_DIR=${TEST_DIR:-$BUILD/tests}
SCRIPTS=${SCRIPTS:-"tests/cli/*.sh tests/node/*.sh"}
# SKIP: names (as printed) of tests to leave out of this run
skipped() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
names=(); cmds=()
for t in "$TEST_DIR"/test_*; do
    [ -x "$t" ] || continue
    skipped "$(basename "$t")" && continue
    names+=("$(basename "$t")"); cmds+=("$t")
done
for t in $SCRIPTS; do
    [ -f "$t" ] || continue
    [ "$(basename "$t")" = lib.sh ] && continue   # sourced by the others
    skipped "$t" && continue
    names+=("$t"); cmds+=("bash $t")
done

# launch: at most JOBS at once; each leaves <i>.log, <i>.rc and <i>.dt (seconds)
for i in "${!cmds[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    (
        t0=$(date +%s)
        # shellcheck disable=SC2086 - a script entry is "bash FILE"
        ${cmds[$i]} >"$work/$i.log" 2>&1
        echo $? >"$work/$i.rc"
        echo $(( $(date +%s) - t0 )) >"$work/$i.dt"
    ) &
done
wait

for i in "${!cmds[@]}"; do
    name=${names[$i]} log="$work/$i.log"
    rc=$(cat "$work/$i.rc" 2>/dev/null || echo 1) dt=$(cat "$work/$i.dt" 2>/dev/null || echo 0)
    p=$(grep -aoE '^\[  PASSED  \] [0-9]+ test' "$log" | awk '{s+=$4} END{print s+0}')
    f=$(grep -aoE '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$4} END{print s+0}')
    if [ "$p" = 0 ] && [ "$f" = 0 ]; then
        line=$(grep -aE '^([A-Za-z]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
        if [ -n "$line" ]; then
            p=$(echo "$line" | sed -E 's/^([A-Za-z]+: )?([0-9]+) passed.*/\2/')
            f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
        elif [ "$rc" = 0 ]; then p=1; else f=1; fi
    fi
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" != 0 ]; then
        failed_names+=("$name")
        echo "FAIL $name (${dt}s)"; sed 's/^/    /' "$log" | tail -60
    else
        echo "ok   $name: $p passed (${dt}s)"
        if [ -n "${VERBOSE:-}" ]; then grep -av '^\[' "$log" | sed 's/^/    /'; fi
    fi
done
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
