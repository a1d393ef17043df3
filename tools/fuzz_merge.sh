#!/usr/bin/env bash
# Merge what tools/gpu/fuzz_bg.sh brought back into the repository (`make fuzz-merge FUZZ_RESULTS=fuzz.tgz`):
#
#   tools/fuzz_merge.sh BUILD_DIR fuzz.tgz...      BUILD_DIR/fuzzers/fuzz_<name>: this machine's libFuzzer programs
#   tools/fuzz_merge.sh BUILD_DIR                  only recompute HOURS.md's totals (and its rows' order)
#
# For every target in the run's stats.tsv:
#   - corpus: the hand-made and generated seeds at the top of tests/fuzz/corpus/<name>/ stay as they are; the
#     inputs fuzzing found live in tests/fuzz/corpus/<name>/found/ (replayed by `make test` like any corpus
#     input, and read by every later run). found/ is minimised again with each merge: libFuzzer -merge=1 over the
#     seeds, then the old found/ and the new inputs, keeps only inputs that add coverage to what is before them.
#     So that the repository and the replay test stay small, an input that takes more than FUZZ_MAX_MS (100 ms)
#     here is left out, and found/ keeps the smallest inputs up to FUZZ_FOUND_FILES (300) files, FUZZ_FOUND_KB
#     (128) KiB and FUZZ_FOUND_TOTAL_MS (2000 ms) of run time per target (this build: -O1, ASan, UBSan).
#   - findings: crash / leak / timeout / out-of-memory inputs are copied to BUILD_DIR/findings/<run>/<name>/
#     (not into the repository: a finding goes to tests/fuzz/regressions/ together with its fix) and listed.
#   - tests/fuzz/HOURS.md: one row per target for the run, and the totals table recomputed from all rows.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:?"usage: $0 BUILD_DIR fuzz.tgz..."}; shift
[ $# -gt 0 ] || echo "fuzz_merge: no results given (FUZZ_RESULTS=path/to/fuzz.tgz): only the totals are recomputed" >&2
MAX_MS=${FUZZ_MAX_MS:-100}; MAX_FILES=${FUZZ_FOUND_FILES:-300}; MAX_KB=${FUZZ_FOUND_KB:-128}
MAX_TOTAL_MS=${FUZZ_FOUND_TOTAL_MS:-2000}
HOURS=tests/fuzz/HOURS.md
export DSV4_ROOT="$PWD"   # the targets find their fixtures (tests/data) from it; select_inputs runs elsewhere
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

count_files() { if [ -d "$1" ]; then find "$1" -maxdepth 1 -type f | wc -l; else echo 0; fi; }

# Keep the smallest of the candidate inputs (args: folder of candidates, destination) within the limits; the
# run times come from the libFuzzer program itself ("Executed FILE in N ms"), one process for all of them.
select_inputs() {
    local name=$1 cand=$2 dst=$3 bin=$4
    local times="$tmp/$name.times"
    if ! (cd "$cand" && ls -A | xargs -r "$OLDPWD/$bin" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048) >"$times.log" 2>&1; then
        mkdir -p "$B/findings/$run_id"; cp "$times.log" "$B/findings/$run_id/$name.replay.log"
        echo "  $name: a returned input FAILS here (a finding): see $B/findings/$run_id/$name.replay.log" >&2
        return 1
    fi
    grep -aoE '^Executed [^ ]+ in [0-9]+ ms' "$times.log" | awk '{print $2, $4}' >"$times"
    # size, ms, name; smallest first; stop at the first limit reached
    local f ms n=0 kb=0 total=0 slow=0 over=0
    while read -r size ms f; do
        if [ "$ms" -gt "$MAX_MS" ]; then slow=$((slow + 1)); continue; fi
        if [ $((n + 1)) -gt "$MAX_FILES" ] || [ $(((kb + size + 1023) / 1024)) -gt "$MAX_KB" ] ||
           [ $((total + ms)) -gt "$MAX_TOTAL_MS" ]; then over=$((over + 1)); continue; fi
        cp "$cand/$f" "$dst/"; n=$((n + 1)); kb=$((kb + size)); total=$((total + ms))
    done < <(while read -r f ms; do echo "$(stat -c %s "$cand/$f") $ms $f"; done <"$times" | sort -n -k1,1 -k2,2)
    echo "$n $slow $over $kb $total"
}

for tgz in "$@"; do
    rm -rf "$tmp/run"; mkdir -p "$tmp/run"
    tar -xzf "$tgz" -C "$tmp/run"
    R="$tmp/run/fuzz"
    [ -f "$R/stats.tsv" ] && [ -f "$R/summary.txt" ] || { echo "fuzz_merge: $tgz is not a fuzz_bg.sh result" >&2; exit 1; }
    head_line=$(head -1 "$R/summary.txt")
    # "fuzz run 2026-12-01T09:35:01Z on HOST, N cpus: REASON after S s"
    run_at=$(echo "$head_line" | awk '{print $3}')
    host=$(echo "$head_line" | sed -E 's/.* on ([^,]+), ([0-9]+) cpus.*/\1, \2 cpus/')
    cores=$(grep -oE '\(([0-9]+) cores\)' "$R/summary.txt" | head -1 | tr -d '()' || true)
    rev=$(awk '$1 == "revision" {print substr($2, 1, 9) ($3 ? "+" : "")}' "$R/STAGED" 2>/dev/null || true)
    [ -n "$rev" ] || rev="local"
    run_id=$(echo "$run_at" | tr -d ':-' | cut -c1-13)
    echo "== $tgz: $head_line"
    if [ "$rev" != local ] && [ "${rev%+}" != "$(git rev-parse --short=9 HEAD)" ]; then
        echo "   (run of revision $rev; merging into $(git rev-parse --short=9 HEAD): coverage is measured with this build)"
    fi
    grep -E '^  ' "$R/summary.txt" | grep -vE '^  (revision|staged|sha256)' || true
    rows=()
    while IFS=$'\t' read -r name procs wall cpu execs rate cov ft new kept crash leak tmo oom slowu restarts; do
        [ "$name" = target ] && continue
        bin="$B/fuzzers/fuzz_$name"
        [ -x "$bin" ] || { echo "fuzz_merge: $bin is not built" >&2; exit 1; }
        # libFuzzer's -timeout is wall-clock time: a process starved behind other work (fuzzing at nice 19 on a
        # shared machine) or stopped for a while reports a fast unit as a timeout. A timeout is a finding only when
        # one of its inputs is still slow here (replayed once with the same 30 s limit, under ASan); otherwise the
        # run row says how many there were and how long the slowest input takes on replay.
        unrepro=""
        if [ "$tmo" != 0 ] && [ -d "$R/artifacts/$name" ]; then
            repro=0; worst=0
            for f in "$R/artifacts/$name"/timeout-*; do
                [ -f "$f" ] || continue
                t0=$(date +%s%N)
                "$bin" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 "$f" >/dev/null 2>&1 || repro=$((repro + 1))
                ms=$(( ($(date +%s%N) - t0) / 1000000 )); [ "$ms" -gt "$worst" ] && worst=$ms
            done
            if [ "$repro" = 0 ]; then unrepro="$tmo wall-clock timeout(s) not reproduced: the slowest input replays in $worst ms"; tmo=0; fi
        fi
        findings=""
        [ "$crash" != 0 ] && findings+="$crash crash "; [ "$leak" != 0 ] && findings+="$leak leak "
        [ "$tmo" != 0 ] && findings+="$tmo timeout "; [ "$oom" != 0 ] && findings+="$oom oom "
        findings=${findings% }; [ -n "$findings" ] || findings=none
        [ -n "$unrepro" ] && { [ "$findings" = none ] && findings="none ($unrepro)" || findings+=" ($unrepro)"; }
        if [ "${findings%% *}" != none ]; then
            mkdir -p "$B/findings/$run_id/$name"
            cp "$R/artifacts/$name"/* "$R/logs/$name".*.log "$B/findings/$run_id/$name/" 2>/dev/null || true
            echo "   FINDING $name ($findings): inputs and logs in $B/findings/$run_id/$name/;"
            echo "     reproduce: $bin $B/findings/$run_id/$name/<file>"
        fi
        # corpus
        dir="tests/fuzz/corpus/$name"; msg="no new inputs"
        if [ -n "$(ls -A "$R/corpus/$name" 2>/dev/null)" ]; then
            m="$tmp/m/$name"; cand="$tmp/cand/$name"; keep="$tmp/keep/$name"
            rm -rf "$m" "$cand" "$keep"; mkdir -p "$m" "$cand" "$keep"
            find "$dir" -maxdepth 1 -type f -exec cp {} "$m"/ \;
            [ -d "tests/fuzz/regressions/$name" ] && cp "tests/fuzz/regressions/$name"/* "$m"/
            ls -A "$m" >"$tmp/seeds"
            dirs=(); [ -d "$dir/found" ] && dirs+=("$dir/found"); dirs+=("$R/corpus/$name")
            "$bin" -merge=1 -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 "$m" "${dirs[@]}" >"$tmp/$name.merge.log" 2>&1 ||
                { echo "fuzz_merge: merge of $name failed:"; tail -20 "$tmp/$name.merge.log"; exit 1; }
            for f in "$m"/*; do grep -qxF "$(basename "$f")" "$tmp/seeds" || mv "$f" "$cand"/; done
            old=$(count_files "$dir/found")
            if [ -n "$(ls -A "$cand")" ]; then
                read -r n slow over bytes ms < <(select_inputs "$name" "$cand" "$keep" "$bin") || exit 1
            else n=0; slow=0; over=0; bytes=0; ms=0; fi
            rm -rf "$dir/found"
            [ "$n" -gt 0 ] && { mkdir -p "$dir/found"; cp "$keep"/* "$dir/found/"; }
            msg="$(count_files "$R/corpus/$name") returned; found/ $old -> $n inputs ($((bytes / 1024)) KiB, $ms ms here)"
            [ "$slow" -gt 0 ] && msg+="; $slow slower than ${MAX_MS} ms left out"
            [ "$over" -gt 0 ] && msg+="; $over left out by the size limits"
        fi
        printf '   %-15s %s\n' "$name" "$msg"
        rows+=("| $run_at | $host${cores:+, $cores} | $rev | $name | $wall | $cpu | $execs | $cov | $ft | $findings |")
    done <"$R/stats.tsv"
    # HOURS.md: the run's rows at the end, then the totals again
    if [ ! -f "$HOURS" ]; then echo "fuzz_merge: $HOURS is missing" >&2; exit 1; fi
    if grep -qF "| $run_at | $host" "$HOURS"; then echo "   (this run is already in $HOURS: rows not added again)"
    else printf '%s\n' "${rows[@]}" >>"$HOURS"; fi
done

# Totals from every run row: per target the CPU hours, execs, the most edges, the findings, and the CPU hours
# since its last run with a finding (what "an hour without a finding after the fixes" asks for). The rows are
# kept in the order of their runs' start times (runs can be merged in any order), and counted in that order.
grep '^| 20[0-9][0-9]-' "$HOURS" | sort -s -t'|' -k2,2 >"$tmp/rows" || true
grep -v '^| 20[0-9][0-9]-' "$HOURS" >"$tmp/rest"
awk -F'|' '
    NR == FNR {
        t = $5; gsub(/ /, "", t); cpu = $7 + 0; ex = $8 + 0; ed = $9 + 0; fi_ = $11; gsub(/^ +| +$/, "", fi_)
        if (!(t in runs)) order[++nt] = t
        runs[t]++; c[t] += cpu; e[t] += ex; if (ed > m[t]) m[t] = ed
        if (fi_ !~ /^none/) { nf[t]++; clean[t] = 0 } else clean[t] += cpu
        next
    }
    /^<!-- totals -->/ {
        print
        print "| target | runs | CPU hours | execs | edges (most) | runs with findings | CPU hours since the last finding |"
        print "|---|---|---|---|---|---|---|"
        for (j = 1; j <= nt; j++) { t = order[j]
            printf "| %s | %d | %.2f | %d | %d | %d | %.2f%s |\n", t, runs[t], c[t] / 3600, e[t], m[t], nf[t], clean[t] / 3600, (clean[t] >= 3600 ? " (done)" : "") }
        skip = 1; next
    }
    /^<!-- \/totals -->/ { skip = 0 }
    skip { next }
    { print }' "$tmp/rows" "$tmp/rest" >"$tmp/hours"
cat "$tmp/rows" >>"$tmp/hours"
cp "$tmp/hours" "$HOURS"
echo "tests/fuzz/HOURS.md updated; review and commit tests/fuzz/corpus/*/found and tests/fuzz/HOURS.md"
