#!/usr/bin/env bash
# `dsv4 serve` (issue 12) on a tiny checkpoint that carries a tokenizer with the V4 chat markers: the official
# npm clients and raw requests (serve_test.mjs), then with curl: the listening line, --api-key (Bearer and
# x-api-key, /health exempt), 429 with Retry-After when the queue is full, 413 before the body is read, option
# errors, SIGTERM during a stream -> exit 0. Prints "N passed, N failed".
set -u
cd "$(dirname "$0")"
BIN=${DSV4_BIN:-../../build/dsv4}
# shellcheck source=lib.sh
. ./lib.sh
server_test_begin serve openai @anthropic-ai/sdk

# ---- the main server: clients, exactness, bad inputs, metrics, soak ----
if start "$T/err1" --max-streams 16 --max-queue 512 --prefix-cache-mb 16 --threads 2; then
    ok
    [ "$(head -1 "$T/err1")" = "dsv4: listening on http://127.0.0.1:$PORT" ] && ok || bad "listening line: $(head -1 "$T/err1")"
    node serve_test.mjs "http://127.0.0.1:$PORT" "$BIN" "$M" "$T" "$PID" >"$T/node.out" 2>&1
    node_counts "$T/node.out" "serve_test.mjs" $? "$T/err1"
    # SIGTERM while a stream runs: the stream ends, the server exits 0
    curl -sN "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt": [1,2,3], "max_tokens": 50000, "stream": true, "ignore_eos": true}' >"$T/long" 2>/dev/null &
    CURL=$!
    sleep 0.5
    kill -TERM "$PID"
    wait "$PID"; src=$?
    wait "$CURL" 2>/dev/null
    [ $src = 0 ] && ok || bad "SIGTERM: exit $src ($(tail -2 "$T/err1"))"
    grep -q '^data: ' "$T/long" && ok || bad "the stream cut by SIGTERM got nothing"
    [ "$(wc -l <"$T/err1")" = 1 ] && ok || bad "stderr has more than the listening line: $(cat "$T/err1")"
else
    bad "main server"
fi

# ---- --spec: speculation inside the scheduler (ngram on this model, V4 MTP on one with the head) ----
run_spec() {   # METHOD MODEL SERVER_ARGS...
    local method=$1 model=$2; shift 2
    if start "$T/err_$method" "$@"; then
        node serve_spec.mjs "http://127.0.0.1:$PORT" "$BIN" "$model" "$method" >"$T/spec_$method.out" 2>&1
        node_counts "$T/spec_$method.out" "serve_spec.mjs $method" $? "$T/err_$method"
        kill -TERM "$PID"; wait "$PID"; src=$?
        [ $src = 0 ] && ok || bad "--spec $method: exit $src"
    else
        bad "--spec $method server"
    fi
}
run_spec ngram "$M" -m "$M" --spec ngram --draft 3 --max-streams 8 --threads 2
M2="$T/m_mtp"
if "$BIN" tiny -o "$M2" --seed 5 --mtp v4 --tokenizer "$T/tokenizer.json" --set vocab_size=271 --set bos_token_id=264 \
    --set eos_token_id=265 >/dev/null 2>&1; then
    run_spec mtp "$M2" -m "$M2" --spec mtp --max-streams 8 --threads 2
else
    bad "tiny with an MTP head"
fi

# ---- --api-key, queue full (429), body limit (413) ----
if start "$T/err2" --api-key s3cret --max-streams 1 --max-queue 0 --max-body-mb 1 --threads 1; then
    U="http://127.0.0.1:$PORT"
    code() { curl -s -o "$T/body" -w '%{http_code}' "$@"; }
    [ "$(code "$U/health")" = 200 ] && ok || bad "health needs no key"
    [ "$(code "$U/v1/models")" = 401 ] && grep -q '"error"' "$T/body" && ok || bad "no key: $(cat "$T/body")"
    [ "$(code -H 'Authorization: Bearer wrong' "$U/v1/models")" = 401 ] && ok || bad "wrong key accepted"
    [ "$(code -H 'Authorization: Bearer s3cre' "$U/v1/models")" = 401 ] && ok || bad "key prefix accepted"
    [ "$(code -H 'Authorization: Bearer s3cret' "$U/v1/models")" = 200 ] && ok || bad "Bearer key refused"
    [ "$(code -H 'x-api-key: s3cret' "$U/v1/models")" = 200 ] && ok || bad "x-api-key refused"
    [ "$(code -H 'x-api-key: nope' "$U/metrics")" = 401 ] && ok || bad "metrics without key"
    [ "$(code -H 'x-api-key: nope' -d '{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}' "$U/v1/messages")" = 401 ] \
        && grep -q '"authentication_error"' "$T/body" && ok || bad "anthropic 401 shape: $(cat "$T/body")"
    # one slot, no queue: a second request while the first streams gets 429 + Retry-After
    curl -sN -H 'x-api-key: s3cret' "$U/v1/completions" -d '{"prompt": [1,2,3], "max_tokens": 50000, "stream": true, "ignore_eos": true}' >/dev/null 2>&1 &
    LONG=$!
    sleep 0.5
    c=$(curl -s -D "$T/hdr" -o "$T/body" -w '%{http_code}' -H 'x-api-key: s3cret' "$U/v1/completions" -d '{"prompt": [1,2], "max_tokens": 2}')
    [ "$c" = 429 ] && grep -qi '^retry-after: ' "$T/hdr" && grep -q '"error"' "$T/body" && ok || bad "queue full: $c $(cat "$T/body")"
    kill "$LONG" 2>/dev/null; wait "$LONG" 2>/dev/null
    # the slot is free again once the aborted stream is cancelled
    c=0
    for _ in $(seq 50); do
        c=$(curl -s -o "$T/body" -w '%{http_code}' -H 'x-api-key: s3cret' "$U/v1/completions" -d '{"prompt": [1,2], "max_tokens": 2}')
        [ "$c" = 200 ] && break; sleep 0.1
    done
    [ "$c" = 200 ] && ok || bad "after the abort the slot stayed busy ($c)"
    head -c 2000000 /dev/zero | tr '\0' 'a' >"$T/big"
    [ "$(code -H 'x-api-key: s3cret' --data-binary @"$T/big" "$U/v1/chat/completions")" = 413 ] && ok || bad "413: $(head -c 200 "$T/body")"
    kill -INT "$PID"; wait "$PID"; src=$?
    [ $src = 0 ] && ok || bad "SIGINT: exit $src"
else
    bad "api-key server"
fi

# ---- option errors: one stderr line, non-zero exit ----
experr() {
    local needle=$1; shift
    "$BIN" serve "$@" >/dev/null 2>"$T/e"; local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$(wc -l <"$T/e")" = 1 ] && grep -qF -- "$needle" "$T/e"; then ok
    else bad "serve $*: rc $rc: $(cat "$T/e")"; fi
}
experr "no CUDA backend" -m "$M" --device cuda
experr "--device" -m "$M" --device tpu
experr "no V4 MTP head" -m "$M" --spec mtp
experr "--spec must be" -m "$M" --spec magic
experr "missing -m"
experr "--port" -m "$M" --port 70000
experr "config.json" -m "$T/nope"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
