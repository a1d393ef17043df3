#!/usr/bin/env bash
# Fuzz every target in the background of a GPU job on the lent machine (tests/fuzz/README.md, "Long runs"):
#
#   tools/gpu/fuzz_bg.sh start SECONDS [CORES]   start, return at once; fuzzing ends by itself after SECONDS
#   tools/gpu/fuzz_bg.sh stop                    end it now if still running, wait for the results, print the table
#   tools/gpu/fuzz_bg.sh wait                    let it run its SECONDS, then print the table
#   tools/gpu/fuzz_bg.sh run SECONDS [CORES]     start and wait (in the foreground: locally, or a fuzz-only call)
#
# From the repository root, .fuzz/ carried (tools/gpu/fuzz_stage.sh). Every target runs at once, so each gets
# the same share of the CORES (default: all but 4) whenever the run ends: one libFuzzer process per target, or
# CORES/targets processes sharing one working corpus when there are cores enough; pinned to the last CORES CPUs
# (taskset) and at nice 19, so the GPU job's own threads come first. Each starts from tests/fuzz/corpus/<name>
# and regressions/<name> (read only) with its dictionary and options, as tests/fuzz/run.sh does. A process that
# stops on a finding (crash, leak, sanitizer report, FUZZ_CHECK, timeout, out-of-memory) leaves its input under
# artifacts/ and is started again (at most FUZZ_RESTARTS times) while time is left.
#
# After SECONDS (or `stop`), the new inputs of each target are minimised against the committed corpus
# (libFuzzer -merge=1, at most FUZZ_MERGE_SECONDS, default 40 s) and everything is packed into ONE file,
# $OUT/fuzz.tgz (the device tool brings back at most 8 files): summary.txt (the table), stats.tsv (one row a
# target, read by tools/fuzz_merge.sh), logs/, artifacts/<name>/, corpus/<name>/ (new inputs), STAGED. Leave
# SECONDS + 110 s inside the device call's limit (a slow unit, the merge, the packing). Fuzzing counts CPU
# seconds (user + system time of the target's processes), the measure that tests/fuzz/HOURS.md adds up.
#
# Environment: OUT (/tmp/gpu-out), FUZZ_TARGETS=a,b (only these), FUZZ_SKIP=a,b, FUZZ_WORK (/tmp/dsv4-fuzz),
# FUZZ_BIN (a fuzz_all to use instead of .fuzz/fuzz_all.xz), FUZZ_RESTARTS (3), FUZZ_MERGE_SECONDS (40),
# FUZZ_NICE (19), FUZZ_TIMEOUT (30: seconds a unit may take before it is a finding).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
export DSV4_ROOT="$ROOT"   # the targets find their fixtures (tests/data) from it
W=${FUZZ_WORK:-/tmp/dsv4-fuzz}
OUT=${OUT:-/tmp/gpu-out}
GRACE=$(( ${FUZZ_TIMEOUT:-30} + 5 ))   # a unit may run up to -timeout past the deadline before libFuzzer looks at the clock

now() { date +%s; }
say() { echo "fuzz_bg: $*"; }

# ---- the supervisor: fuzz, then merge and pack ------------------------------------------------------------------
# One process of one target, started again after a finding while time is left; its CPU time comes from `times`
# (this subshell's children), its wall time from the clock.
run_process() {
    local name=$1 p=$2 end=$3
    local log="$W/logs/$name.$p.log" attempt=0 t0 rc left
    local args=(-timeout="${FUZZ_TIMEOUT:-30}" -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 -reload=1
                -artifact_prefix="$W/artifacts/$name/")
    [ -f "tests/fuzz/dict/$name.dict" ] && args+=(-dict="$ROOT/tests/fuzz/dict/$name.dict")
    if [ -f "tests/fuzz/options/$name" ]; then local extra; read -r -a extra <"tests/fuzz/options/$name"; args+=("${extra[@]}"); fi
    local dirs=("$W/corpus/$name")
    for d in "tests/fuzz/corpus/$name" "tests/fuzz/regressions/$name"; do [ -d "$d" ] && dirs+=("$ROOT/$d"); done
    t0=$(now)
    while :; do
        left=$((end - $(now)))
        [ $left -ge 5 ] && [ ! -e "$W/stop" ] || break
        attempt=$((attempt + 1))
        echo "=== fuzz_bg attempt $attempt: ${left}s" >>"$log"
        "${PREFIX[@]}" env DSV4_FUZZ_TARGET="$name" "$BIN" "${args[@]}" ${LEAKS[@]+"${LEAKS[@]}"} -max_total_time="$left" "${dirs[@]}" >>"$log" 2>&1 &
        echo $! >"$W/pids/$name.$p"
        wait $!; rc=$?
        rm -f "$W/pids/$name.$p"
        echo "=== fuzz_bg exit $rc" >>"$log"
        # 0: time is up; 72: interrupted by the supervisor; anything else is a finding (its input is in artifacts/)
        [ $rc = 0 ] || [ $rc = 72 ] || [ $attempt -gt "${FUZZ_RESTARTS:-3}" ] && break
    done
    # `times` itself, not in a pipe or $(...): a subshell has no children of its own
    local cpu
    times >"$W/cpu/$name.$p.times"
    cpu=$(tail -1 "$W/cpu/$name.$p.times" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); s += a[1] * 60 + a[2] } printf "%.0f", s }')
    rm -f "$W/cpu/$name.$p.times"
    echo "$attempt $(( $(now) - t0 )) $cpu" >"$W/cpu/$name.$p"
}

# Per-target numbers from its logs: execs (final stats, or the last status line of a process that was killed),
# coverage edges (cov), features (ft), the working corpus, findings by kind.
target_stats() {
    local name=$1 procs=$2
    local attempts=0 wall=0 cpu=0 f
    for f in "$W"/cpu/"$name".*; do
        [ -f "$f" ] || continue
        read -r a w c <"$f"; attempts=$((attempts + a)); [ "$w" -gt "$wall" ] && wall=$w; cpu=$((cpu + c))
    done
    local nums
    nums=$(cat "$W"/logs/"$name".*.log 2>/dev/null | awk '
        function flush() { execs += (st != "" ? st : last); st = ""; last = 0 }
        /^=== fuzz_bg attempt/ { flush(); next }
        /stat::number_of_executed_units:/ { st = $2 }
        /^#[0-9]+/ { last = substr($1, 2) + 0 }
        { for (i = 1; i < NF; i++) {
              if ($i == "cov:" && $(i+1) + 0 > cov) cov = $(i+1) + 0
              if ($i == "ft:" && $(i+1) + 0 > ft) ft = $(i+1) + 0 } }
        END { flush(); printf "%d %d %d", execs, cov, ft }')
    local execs cov ft; read -r execs cov ft <<<"$nums"
    local art="$W/artifacts/$name" crash leak tmo oom slow
    crash=$(ls "$art" 2>/dev/null | grep -c -E '^(crash|deadly_signal|misc)-'); leak=$(ls "$art" 2>/dev/null | grep -c '^leak-')
    tmo=$(ls "$art" 2>/dev/null | grep -c '^timeout-'); oom=$(ls "$art" 2>/dev/null | grep -c '^oom-')
    slow=$(ls "$art" 2>/dev/null | grep -c '^slow-unit-')
    local new kept
    new=$(ls "$W/corpus/$name" 2>/dev/null | wc -l); kept=$(ls "$W/pack/fuzz/corpus/$name" 2>/dev/null | wc -l)
    local rate=0; [ "$cpu" -gt 0 ] && rate=$((execs / cpu))
    printf '%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n' "$name" "$procs" "$wall" "$cpu" "$execs" \
        "$rate" "$cov" "$ft" "$new" "$kept" "$crash" "$leak" "$tmo" "$oom" "$slow" "$((attempts - procs))"
}

# The new inputs worth keeping: those that add coverage to the committed corpus (merge into a copy of it), or
# all of them when the merge does not finish in time. Names stay libFuzzer's (the input's SHA-1). On the same
# CPUs and niceness as the fuzzing: the GPU job may still be running.
minimise() {
    local name=$1 secs=$2
    local work="$W/corpus/$name" min="$W/min/$name" dst="$W/pack/fuzz/corpus/$name"
    [ -n "$(ls -A "$work" 2>/dev/null)" ] || return 0
    mkdir -p "$min" "$dst"
    for d in "tests/fuzz/corpus/$name" "tests/fuzz/regressions/$name"; do [ -d "$d" ] && find "$d" -type f -exec cp {} "$min"/ \;; done
    ls "$min" >"$W/min/$name.seeds"
    if timeout "$secs" "${PREFIX[@]}" env DSV4_FUZZ_TARGET="$name" "$BIN" -merge=1 -timeout=30 -rss_limit_mb=2048 \
            -malloc_limit_mb=2048 "$min" "$work" >"$W/logs/merge-$name.log" 2>&1; then
        for f in "$min"/*; do grep -qxF "$(basename "$f")" "$W/min/$name.seeds" || cp "$f" "$dst"/; done
    else
        echo "merge of $name did not finish in ${secs}s: all $(ls "$work" | wc -l) new inputs kept" >>"$W/notes"
        cp "$work"/* "$dst"/
    fi
}

supervise() {
    local secs=$1 cores=$2
    local t_start; t_start=$(now)
    local end=$((t_start + secs))
    echo "$end" >"$W/end"
    mkdir -p "$W/logs" "$W/artifacts" "$W/corpus" "$W/pids" "$W/cpu" "$W/min" "$W/pack/fuzz"
    : >"$W/notes"
    # the program: carried compressed, or given (a local build)
    if [ -n "${FUZZ_BIN:-}" ]; then BIN=$FUZZ_BIN
    else
        # xz where it is installed, else Python's lzma (python3 is on every GPU machine)
        BIN="$W/fuzz_all"
        { xz -dc .fuzz/fuzz_all.xz 2>/dev/null ||
          python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' .fuzz/fuzz_all.xz; } >"$BIN" &&
            chmod +x "$BIN" || { echo "cannot unpack .fuzz/fuzz_all.xz (tools/gpu/fuzz_stage.sh)" >>"$W/notes"; finish "$t_start" setup-failed; return; }
    fi
    # what was fuzzed: a given local build is this checkout's revision (the staged .fuzz/STAGED is not it)
    if [ -n "${FUZZ_BIN:-}" ]; then
        { echo "revision $(git rev-parse HEAD 2>/dev/null)$([ -z "$(git status --porcelain -- src include tests/fuzz Makefile 2>/dev/null)" ] || echo " (with uncommitted changes)")"
          echo "staged $(date -u -r "$FUZZ_BIN" +%Y-%m-%dT%H:%M:%SZ) (FUZZ_BIN=$FUZZ_BIN)"
          echo "sha256 $(sha256sum "$FUZZ_BIN" | cut -d' ' -f1)"; } >"$W/pack/fuzz/STAGED"
    elif [ -f .fuzz/STAGED ]; then cp .fuzz/STAGED "$W/pack/fuzz/STAGED"; fi
    # targets: every tests/fuzz/fuzz_<name>.c, less FUZZ_SKIP, or FUZZ_TARGETS
    TARGETS=()
    for src in tests/fuzz/fuzz_*.c; do
        local name; name=$(basename "$src" .c); name=${name#fuzz_}
        if [ -n "${FUZZ_TARGETS:-}" ] && [[ ",$FUZZ_TARGETS," != *",$name,"* ]]; then continue; fi
        [[ ",${FUZZ_SKIP:-}," == *",$name,"* ]] && continue
        TARGETS+=("$name")
    done
    # cores: the last CORES CPUs, so the GPU job's threads find the first ones free
    local ncpu; ncpu=$(nproc)
    [ "$cores" -gt "$ncpu" ] && cores=$ncpu
    [ "$cores" -lt 1 ] && cores=1
    local cpus="$((ncpu - cores))-$((ncpu - 1))"
    PREFIX=(nice -n "${FUZZ_NICE:-19}")
    if command -v taskset >/dev/null && taskset -c "$cpus" true 2>/dev/null; then PREFIX+=(taskset -c "$cpus")
    else echo "taskset unavailable: processes not pinned (nice ${FUZZ_NICE:-19} only)" >>"$W/notes"; cpus="any"; fi
    local procs=$((cores / ${#TARGETS[@]})); [ $procs -lt 1 ] && procs=1
    # targets write their inputs to files: in memory where /dev/shm is writable; in a folder of this run, since a
    # process that stops on a finding or an interrupt leaves its fixture folder behind (no atexit)
    if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -gt 262144 ]; then
        TMPDIR=/dev/shm/dsv4-fuzz-bg
    else TMPDIR="$W/tmp"; fi
    rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"; export TMPDIR
    # preflight: one target over its seeds; a sandbox that stops LeakSanitizer (it needs ptrace) gets leaks off
    DSV4_FUZZ_TARGET=config "$BIN" -runs=0 tests/fuzz/corpus/config >"$W/logs/preflight.log" 2>&1
    local rc=$?
    LEAKS=()
    if grep -qE "LeakSanitizer (has encountered a fatal error|does not work under ptrace)" "$W/logs/preflight.log"; then
        export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"; LEAKS=(-detect_leaks=0)
        echo "LeakSanitizer does not run here (preflight): leaks NOT checked in this run" >>"$W/notes"
        DSV4_FUZZ_TARGET=config "$BIN" -runs=0 tests/fuzz/corpus/config >>"$W/logs/preflight.log" 2>&1; rc=$?
    fi
    if [ $rc != 0 ]; then echo "preflight failed (rc $rc): see logs/preflight.log" >>"$W/notes"; finish "$t_start" setup-failed; return; fi
    echo "${#TARGETS[@]} targets, $procs process(es) each, cpus $cpus ($cores cores), $secs s planned" >>"$W/notes"
    local name p
    for name in "${TARGETS[@]}"; do
        mkdir -p "$W/corpus/$name" "$W/artifacts/$name"
        for p in $(seq 1 $procs); do run_process "$name" "$p" "$end" & done
    done
    # wait for the processes; on `stop` or past the deadline (a slow unit), interrupt them (libFuzzer prints its
    # final stats on SIGINT), then kill what is left
    local reason=time-up interrupted=0
    while [ -n "$(jobs -rp)" ]; do
        sleep 1
        if [ $interrupted = 0 ] && { [ -e "$W/stop" ] || [ "$(now)" -gt $((end + GRACE)) ]; }; then
            [ -e "$W/stop" ] && reason=stopped || reason=deadline
            touch "$W/stop"; interrupted=$(now)
            for f in "$W"/pids/*; do [ -f "$f" ] && kill -INT "$(cat "$f")" 2>/dev/null; done
        elif [ $interrupted != 0 ] && [ "$(now)" -gt $((interrupted + 10)) ]; then
            for f in "$W"/pids/*; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null && echo "killed $(basename "$f")" >>"$W/notes"; done
            interrupted=$((interrupted + 1000000))
        fi
    done
    wait
    # minimise every target's new inputs at once (merge runs in its own processes, so in parallel on the cores)
    for name in "${TARGETS[@]}"; do minimise "$name" "${FUZZ_MERGE_SECONDS:-40}" & done
    wait
    printf 'target\tprocs\twall_s\tcpu_s\texecs\texecs_per_s\tcov\tft\tnew\tkept\tcrash\tleak\ttimeout\toom\tslow\trestarts\n' >"$W/pack/fuzz/stats.tsv"
    for name in "${TARGETS[@]}"; do target_stats "$name" "$procs" >>"$W/pack/fuzz/stats.tsv"; done
    finish "$t_start" "$reason"
}

# summary.txt and the one file that comes back, $OUT/fuzz.tgz
finish() {
    local t_start=$1 reason=$2 P="$W/pack/fuzz"
    mkdir -p "$P/logs" "$P/artifacts" "$OUT"
    {
        echo "fuzz run $(date -u -d "@$t_start" +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nproc) cpus: $reason after $(( $(now) - t_start )) s"
        [ -f "$P/STAGED" ] && sed 's/^/  /' "$P/STAGED"
        sed 's/^/  /' "$W/notes"
        if [ -f "$P/stats.tsv" ]; then
            awk -F'\t' 'NR == 1 { printf "%-15s %5s %6s %6s %11s %7s %6s %6s %5s %5s  %s\n", "target", "procs", "wall_s", "cpu_s", "execs", "exec/s", "edges", "ft", "new", "kept", "findings"; next }
                 { f = ""; if ($11) f = f $11 " crash "; if ($12) f = f $12 " leak "; if ($13) f = f $13 " timeout "; if ($14) f = f $14 " oom ";
                   sub(/ $/, "", f); if (f == "") f = "none"; if ($15) f = f " (" $15 " slow units)"
                   printf "%-15s %5d %6d %6d %11d %7d %6d %6d %5d %5d  %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, f
                   tc += $4; te += $5; if ($11 + $12 + $13 + $14) bad = bad " " $1 }
                 END { printf "total: %d cpu-seconds, %d execs; findings in:%s\n", tc, te, bad == "" ? " none" : bad }' "$P/stats.tsv"
        fi
    } >"$P/summary.txt"
    # logs: whole when small; else the start and the end (a finding's report is at the end of its attempt)
    for f in "$W"/logs/*.log; do
        [ -f "$f" ] || continue
        if [ "$(stat -c %s "$f")" -gt 1500000 ]; then
            { head -c 300000 "$f"; printf '\n=== fuzz_bg: log cut here ===\n'; tail -c 1000000 "$f"; } >"$P/logs/$(basename "$f")"
        else cp "$f" "$P/logs/"; fi
    done
    cp -r "$W"/artifacts/. "$P/artifacts/" 2>/dev/null
    tar -czf "$OUT/fuzz.tgz.tmp" -C "$W/pack" fuzz
    if [ "$(stat -c %s "$OUT/fuzz.tgz.tmp")" -gt $((15 * 1024 * 1024)) ]; then
        echo "  fuzz.tgz over 15 MiB: new corpus inputs left out" >>"$P/summary.txt"
        rm -rf "$P/corpus"; tar -czf "$OUT/fuzz.tgz.tmp" -C "$W/pack" fuzz
    fi
    mv "$OUT/fuzz.tgz.tmp" "$OUT/fuzz.tgz"
    [ -n "${TMPDIR:-}" ] && [[ "$TMPDIR" == */dsv4-fuzz-bg || "$TMPDIR" == "$W/tmp" ]] && rm -rf "$TMPDIR"
    touch "$W/done"
}

# ---- the commands ----------------------------------------------------------------------------------------------
# (inside a function, so that bash has read the whole file before it runs: editing this file while a run is
# going does not break that run)
main() {
    local cmd=${1:-} secs cores limit
    case "$cmd" in
    start|run)
        secs=${2:?"usage: $0 start|run SECONDS [CORES]"}
        cores=${3:-$(( $(nproc) > 5 ? $(nproc) - 4 : 1 ))}
        if [ -f "$W/supervisor.pid" ] && kill -0 "$(cat "$W/supervisor.pid")" 2>/dev/null; then
            say "a run is already going (supervisor $(cat "$W/supervisor.pid"))"; exit 1
        fi
        rm -rf "$W"; mkdir -p "$W"
        supervise "$secs" "$cores" >"$W/supervisor.log" 2>&1 &
        echo $! >"$W/supervisor.pid"
        say "started (supervisor $(cat "$W/supervisor.pid")): $secs s on $cores cores; \`$0 stop\` ends it and prints the table; results in $OUT/fuzz.tgz"
        [ "$cmd" = start ] && exit 0
        wait
        cat "$W/pack/fuzz/summary.txt"
        ;;
    stop|wait)
        [ -d "$W" ] || { say "no run under $W"; exit 1; }
        limit=$(( $(now) + GRACE + 15 + ${FUZZ_MERGE_SECONDS:-40} + 30 ))
        if [ "$cmd" = stop ]; then touch "$W/stop"
        else limit=$(( limit + $(cat "$W/end" 2>/dev/null || now) - $(now) )); fi
        while [ ! -e "$W/done" ] && [ "$(now)" -lt $limit ]; do sleep 1; done
        if [ -e "$W/done" ]; then cat "$W/pack/fuzz/summary.txt"
        else say "the run did not finish packing in time; supervisor log:"; tail -20 "$W/supervisor.log"; exit 1; fi
        ;;
    *)
        sed -n '2,24p' "$0"; exit 2
        ;;
    esac
}
main "$@"; exit $?
