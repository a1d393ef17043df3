#!/usr/bin/env bash
# `--amx` on the commands that run the model (OFFICIAL mode's linears with bf16 inputs on AMX tiles). On a CPU
# with AMX-BF16: logits in one call = token by token = random chunks (cmp), generate = generate in chunks of the
# prompt, and the AMX order really is used (the logits differ from the fp32 kernels'). Without AMX: one clear
# line, exit 1, for every command. Run from the repository root with DSV4_BIN set.
. "$(dirname "$0")/lib.sh"
"$BIN" tiny -o "$T/m" --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 \
    --set index_topk=3 >/dev/null 2>&1 || { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }
P=$(seq -s, 3 90)
if grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null &&
   "$BIN" logits -m "$T/m" --tokens 1,2 --mode official --amx --out "$T/probe.npy" >/dev/null 2>"$T/probe.err"; then
    "$BIN" logits -m "$T/m" --tokens "$P" --mode official --amx --out "$T/one.npy" >/dev/null 2>&1
    "$BIN" logits -m "$T/m" --tokens "$P" --mode official --amx --chunks 1 --out "$T/tok.npy" >/dev/null 2>&1
    "$BIN" logits -m "$T/m" --tokens "$P" --mode official --amx --chunks 7,1,30,2,17 --out "$T/chunks.npy" >/dev/null 2>&1
    "$BIN" logits -m "$T/m" --tokens "$P" --mode official --out "$T/fp32.npy" >/dev/null 2>&1
    [ -s "$T/one.npy" ] && cmp -s "$T/one.npy" "$T/tok.npy" && ok || bad "--amx: token by token differs from one call"
    [ -s "$T/one.npy" ] && cmp -s "$T/one.npy" "$T/chunks.npy" && ok || bad "--amx: random chunks differ from one call"
    cmp -s "$T/one.npy" "$T/fp32.npy" && bad "--amx changed nothing (the AMX linears did not run)" || ok
    # two streams in one scheduler, prompts prefilled 16 tokens a step beside each other = one stream alone
    a=$("$BIN" generate -m "$T/m" --tokens "$P" -n 10 --ids --mode official --amx 2>/dev/null)
    printf '%s\n%s\n' "$P" "$P" >"$T/batch"
    b=$("$BIN" generate -m "$T/m" --batch "$T/batch" -n 10 --ids --mode official --amx --step-tokens 16 2>/dev/null)
    [ -n "$a" ] && [ "$b" = "$(printf '0: %s\n1: %s' "$a" "$a")" ] && ok || bad "--amx generate: '$a' vs batched '$b'"
else
    echo "  no AMX-BF16 here: checking the error line only"
    for c in logits generate; do
        expect_err "$c --amx without AMX" "AMX" "$BIN" $c -m "$T/m" --tokens 1,2 --mode official --amx
    done
fi
finish
