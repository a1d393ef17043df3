#!/usr/bin/env bash
# `dsv4 serve --spec mtp|dspark --prefix-cache-dir DIR` across a restart (issue 12): a server runs requests
# against an empty cache folder, exits (SIGTERM), and a new server on the same folder runs them again: prefixes and
# the drafter's state come back from disk (cached_tokens > 0) with the cold run's ids and acceptance
# (serve_restart.mjs). The folder holds a drafter-state file (.mtp.dsv4comp / .dspark.dsv4comp) beside each state
# file. DSV4_DEVICE=cuda runs the servers (and the `dsv4 generate` references) on the GPU. Prints "N passed,
# N failed".
set -u
cd "$(dirname "$0")"
BIN=${DSV4_BIN:-../../build/dsv4}
# shellcheck source=lib.sh
. ./lib.sh
server_test_begin serve_restart openai

phase() {   # METHOD MODEL PHASE
    local method=$1 model=$2 ph=$3
    if start "$T/err_${method}_$ph" -m "$model" --spec "$method" --max-streams 4 --threads 2 --prefix-cache-mb 16 \
        --prefix-cache-dir "$T/pc_$method" --device "${DSV4_DEVICE:-cpu}"; then
        node serve_restart.mjs "http://127.0.0.1:$PORT" "$BIN" "$model" "$method" "$ph" "$T/cold_$method.json" \
            >"$T/out_${method}_$ph" 2>&1
        node_counts "$T/out_${method}_$ph" "serve_restart.mjs $method $ph" $? "$T/err_${method}_$ph"
        kill -TERM "$PID"; wait "$PID"; src=$?
        [ $src = 0 ] && ok || bad "--spec $method ($ph): exit $src"
    else
        bad "--spec $method server ($ph)"
    fi
}

for method in mtp dspark; do
    head=v4; [ $method = dspark ] && head=dspark
    model="$T/m_$method"
    if ! "$BIN" tiny -o "$model" --seed 5 --mtp $head --tokenizer "$T/tokenizer.json" --set vocab_size=271 \
        --set bos_token_id=264 --set eos_token_id=265 >/dev/null 2>&1; then
        bad "tiny with a $method head"; continue
    fi
    phase $method "$model" cold
    # every stored state has the drafter's state beside it
    n_seq=$(ls "$T/pc_$method" | grep -c '\.dsv4seq$')
    n_comp=$(ls "$T/pc_$method" | grep -c "\.$method\.dsv4comp$")
    [ "$n_seq" -gt 0 ] && [ "$n_comp" = "$n_seq" ] && ok || bad "$method: $n_seq state files, $n_comp drafter-state files"
    phase $method "$model" warm
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
