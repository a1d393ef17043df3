#!/usr/bin/env bash
# Replays every committed fuzz input (tests/fuzz/corpus/<target>/ and tests/fuzz/regressions/<target>/) through
# its target's replay program ($BUILD/fuzz/fuzz_<target>, built by `make`). Each input is one test; a target
# that crashes, leaks (under make test-asan), breaks an invariant or runs past FUZZ_REPLAY_TIMEOUT seconds
# (default 300) fails. Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
B=${BUILD:-$(dirname "${DSV4_BIN:-build/dsv4}")}
B=${B#"$PWD/"}
export DSV4_ROOT="$PWD"
pass=0; fail=0; n_targets=0
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c); name=${name#fuzz_}
    bin="$B/fuzz/fuzz_$name"
    n_targets=$((n_targets + 1))
    if [ ! -x "$bin" ]; then echo "FAIL: $bin is not built"; fail=$((fail + 1)); continue; fi
    # a regression input may be a hang that came back: bound each target's replay
    out=$(timeout "${FUZZ_REPLAY_TIMEOUT:-300}" "$bin" "tests/fuzz/corpus/$name" "tests/fuzz/regressions/$name" 2>&1)
    rc=$?
    n=$(echo "$out" | grep -aE '^[0-9]+ passed, 0 failed$' | tail -1 | awk '{print $1}')
    if [ $rc != 0 ] || [ -z "$n" ] || [ "$n" = 0 ]; then
        echo "FAIL: replay of $name (rc $rc, ${n:-0} inputs):"
        echo "$out" | tail -30 | sed 's/^/    /'
        fail=$((fail + 1))
    else
        pass=$((pass + n))
    fi
done
echo "fuzz replay: $n_targets targets"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
