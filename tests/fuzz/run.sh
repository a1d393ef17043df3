#!/usr/bin/env bash
# Runs libFuzzer targets one after another (the CI machine and the dev box have 2 cores shared with others):
#   tests/fuzz/run.sh BUILD_DIR SECONDS [name,name,...]
# Each target fuzzes for SECONDS from a working corpus in BUILD_DIR/corpus/<name> (seeded from the committed
# tests/fuzz/corpus/<name> and tests/fuzz/regressions/<name>, which are read, never written), with the
# dictionary tests/fuzz/dict/<name>.dict and the options in tests/fuzz/options/<name> when they exist.
# A finding (crash, leak, sanitizer report, FUZZ_CHECK, a unit running past 30 s, out-of-memory: -timeout is
# generous because the 2-core machines are shared and a stalled process once tripped 10 s) leaves its input in
# BUILD_DIR/artifacts/<name>/ and makes the script exit 1 after the remaining targets ran.
# FUZZ_JOBS=N runs N workers per target (libFuzzer -fork), for a machine with cores to spare.
# FUZZ_SKIP=name,... leaves targets out (CI: see .ci/run).
set -u
cd "$(dirname "$0")/../.."
B=${1:?build dir}; SECS=${2:?seconds}; ONLY=${3:-}
JOBS=${FUZZ_JOBS:-1}
# Targets write their inputs to files (checkpoints, cache files): keep that in memory when /dev/shm is there.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
failed=(); summary=()
for bin in "$B"/fuzzers/fuzz_*; do
    [ -x "$bin" ] || continue
    name=$(basename "$bin"); name=${name#fuzz_}
    [ "$name" = all ] && continue   # fuzz_all (make fuzz-all) holds every target: not one of its own
    if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
    if [[ ",${FUZZ_SKIP:-}," == *",$name,"* ]]; then summary+=("$name: skipped (FUZZ_SKIP)"); continue; fi
    work="$B/corpus/$name"; art="$B/artifacts/$name"
    mkdir -p "$work" "$art"
    args=(-max_total_time="$SECS" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1
          -artifact_prefix="$art/")
    [ -f "tests/fuzz/dict/$name.dict" ] && args+=(-dict="tests/fuzz/dict/$name.dict")
    [ -f "tests/fuzz/options/$name" ] && read -r -a extra <"tests/fuzz/options/$name" && args+=("${extra[@]}")
    [ "$JOBS" -gt 1 ] && args+=(-fork="$JOBS" -ignore_crashes=0)
    dirs=("$work")
    for d in "tests/fuzz/corpus/$name" "tests/fuzz/regressions/$name"; do [ -d "$d" ] && dirs+=("$d"); done
    log="$B/fuzz-$name.log"
    echo "fuzz $name: ${SECS}s"
    "$bin" "${args[@]}" "${dirs[@]}" >"$log" 2>&1
    rc=$?
    execs=$(grep -a 'stat::number_of_executed_units' "$log" | awk '{print $2}' | tail -1)
    rate=$(grep -a 'stat::average_exec_per_sec' "$log" | awk '{print $2}' | tail -1)
    cov=$(grep -aoE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    summary+=("$(printf '%-16s rc %-3s %10s execs %7s/s  %6s edges' "$name" "$rc" "${execs:-?}" "${rate:-?}" "${cov:-?}")")
    if [ $rc != 0 ]; then
        failed+=("$name")
        echo "FINDING in $name (rc $rc): log $log, inputs in $art/"
        grep -aE 'ERROR|FUZZ CHECK|SUMMARY|Test unit written' "$log" | head -8 | sed 's/^/    /'
    fi
done
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then echo "fuzz: findings in ${failed[*]}"; exit 1; fi
echo "fuzz: no findings"
