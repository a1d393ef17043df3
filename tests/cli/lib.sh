# Shared by the command-line tests (sourced, not run): the binary, a scratch folder removed on exit, pass/fail
# counters and the two checks every script needs. A script ends with `finish`, which prints the closing line
# "N passed, N failed" that tests/run_all.sh reads and exits non-zero on any failure.
set -u
BIN=${DSV4_BIN:-build/dsv4}
T=$(mktemp -d "/tmp/dsv4_$(basename "$0" .sh).XXXXXX")
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# expect_ok NAME CMD...: exit 0
expect_ok() {
    local name=$1; shift
    if "$@" >"$T/out" 2>"$T/err"; then ok; else bad "$name (rc $?): $(head -3 "$T/err")"; fi
}

# expect_err NAME NEEDLE CMD...: non-zero exit below 128 (no signal), exactly one stderr line, containing NEEDLE
expect_err() {
    local name=$1 needle=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$? lines
    lines=$(wc -l <"$T/err")
    if [ $rc -eq 0 ]; then bad "$name: exit 0, expected an error"
    elif [ $rc -ge 128 ]; then bad "$name: killed by a signal (rc $rc)"
    elif [ "$lines" -ne 1 ]; then bad "$name: $lines stderr lines: $(cat "$T/err")"
    elif ! grep -qF -- "$needle" "$T/err"; then bad "$name: message lacks '$needle': $(cat "$T/err")"
    else ok; fi
    [ -n "${VERBOSE:-}" ] && echo "  $name: $(cat "$T/err")"
    return 0
}

finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
