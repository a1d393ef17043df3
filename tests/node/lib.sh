# Shared by the `dsv4 serve` scripts (serve.sh, serve_restart.sh, response_format_thinking.sh, chat_page.sh): the
# counters, a scratch folder and the servers' cleanup (server_test_begin), a tiny checkpoint with the V4 chat
# markers, and start() for a server on a free port. Sourced, not run (tests/run_all.sh skips lib.sh), after
# `cd tests/node` and BIN; sets T (the scratch folder), PIDS, M (the model folder).

pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# server_test_begin NAME [NPM_MODULE...]: the modules the script needs (else one line and a failed run), a scratch
# folder /tmp/dsv4_NAME.*, every server started by start() killed and the folder removed on exit, and the model.
server_test_begin() {
    local name=$1 mod
    shift
    for mod in "$@"; do
        if [ ! -d "node_modules/$mod" ]; then
            echo "tests/node: npm dependencies missing (run 'npm ci' in tests/node)"; echo "0 passed, 1 failed"; exit 1
        fi
    done
    T=$(mktemp -d "/tmp/dsv4_$name.XXXXXX")
    PIDS=()
    trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
    make_model || { echo "tiny model failed"; echo "0 passed, 1 failed"; exit 1; }
}

# the tiny tokenizer + the V4 chat markers as ids 264..270; vocab_size 271 so every id decodes, and the
# checkpoint's BOS / EOS are the tokenizer's (so `dsv4 generate` stops where the server does)
make_model() {
    node -e '
const fs = require("fs");
const t = JSON.parse(fs.readFileSync("../data/text/tiny_tokenizer.json", "utf8"));
const marks = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"];
marks.forEach((c, i) => t.added_tokens.push({id: 264 + i, content: c, single_word: false, lstrip: false,
                                             rstrip: false, normalized: false, special: true}));
fs.writeFileSync(process.argv[1], JSON.stringify(t));' "$T/tokenizer.json" || return 1
    M="$T/m"
    "$BIN" tiny -o "$M" --seed 3 --tokenizer "$T/tokenizer.json" --set vocab_size=271 --set bos_token_id=264 \
        --set eos_token_id=265 >/dev/null 2>&1
}

# start ERR_FILE SERVER_ARGS...: sets PID and PORT once the listening line is there (or fails)
start() {
    local err=$1; shift
    "$BIN" serve -m "$M" --port 0 "$@" 2>"$err" &
    PID=$!
    PIDS+=("$PID")
    PORT=
    for _ in $(seq 300); do
        PORT=$(sed -n 's|^dsv4: listening on http://127\.0\.0\.1:\([0-9][0-9]*\)$|\1|p' "$err" | head -1)
        [ -n "$PORT" ] && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server did not start: $(cat "$err")"
    return 1
}

# node_counts OUT NAME RC SERVER_ERR: a node test wrote OUT (ending "N passed, N failed") and exited RC: show its
# other lines and add its counts; no count line is a crash, a non-zero exit with 0 failures a failure.
node_counts() {
    local out=$1 name=$2 rc=$3 err=$4 line f
    grep -v '^[0-9]* passed, [0-9]* failed$' "$out"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -1)
    if [ -n "$line" ]; then
        pass=$((pass + ${line%% passed*})); f=${line##*, }; fail=$((fail + ${f%% failed}))
        [ "$rc" -ne 0 ] && [ "${f%% failed}" = 0 ] && bad "$name exit $rc"
    else
        bad "$name crashed (exit $rc); server stderr: $(tail -20 "$err")"
    fi
    return 0
}
