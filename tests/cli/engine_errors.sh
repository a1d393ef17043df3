#!/usr/bin/env bash
# Bad input to the engine commands gives a one-line error and a non-zero exit, never a crash: token ids out of
# range, context overflow, bad options, a missing or damaged model folder. Prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"

M=$T/model
"$BIN" tiny -o "$M" --preset flash-tiny --seed 5 --set max_position_embeddings=40 >/dev/null 2>&1 || { echo "cannot write model"; echo "0 passed, 1 failed"; exit 1; }

expect_ok    "valid logits"            "$BIN" logits -m "$M" --tokens 1,2,3 --out "$T/a.npy"
expect_ok    "valid generate"          "$BIN" generate -m "$M" --tokens 1,2,3 -n 4 --ids
expect_err   "token id too large"      "outside the vocabulary" "$BIN" logits -m "$M" --tokens 1,2,512
expect_err   "negative token id"       "bad token list" "$BIN" logits -m "$M" --tokens 1,-2,3
expect_err   "garbage token list"      "bad token list" "$BIN" logits -m "$M" --tokens 1,x,3
expect_err   "empty token list"        "empty token list" "$BIN" logits -m "$M" --tokens ""
toks=$(seq -s, 1 41)
expect_err   "context overflow"        "context overflow" "$BIN" logits -m "$M" --tokens "$toks"
expect_err   "overflow while generating" "context overflow" "$BIN" generate -m "$M" --tokens "$(seq -s, 1 38)" -n 10 --ids
expect_err   "chunks exceed tokens"    "--chunks add up" "$BIN" logits -m "$M" --tokens 1,2,3 --chunks 2,2
expect_err   "bad mode"                "--mode must be" "$BIN" logits -m "$M" --tokens 1 --mode fast
expect_err   "unknown option"          "unknown option" "$BIN" logits -m "$M" --tokens 1 --frobnicate
expect_err   "missing model dir"       "no config.json" "$BIN" logits -m "$T/nowhere" --tokens 1
expect_err   "top-p zero"              "top-p" "$BIN" generate -m "$M" --tokens 1 -n 2 --temp 1 --top-p 0
expect_err   "unbuilt kv format"       "--kv" "$BIN" logits -m "$M" --tokens 1 --kv q4
expect_err   "unknown command"         "unknown command" "$BIN" frobnicate
expect_err   "--gpus on the cpu"       "more than one GPU needs the cuda device" "$BIN" logits -m "$M" --tokens 1 --gpus 2
expect_err   "--gpus 0"                "--gpus must be" "$BIN" logits -m "$M" --tokens 1 --gpus 0

# a synthetic benchmark checkpoint with holes for its big matrices (dsv4 bench --synthetic flash): the CPU fills them
# in host memory (model/synthetic.h; test_synth_host checks the values), within DSV4_SYNTHETIC_HOST_GB:
# written sparse (its apparent size far beyond the blocks it uses)
"$BIN" tiny -o "$T/holes" --preset flash-tiny --seed 5 --set dsv4_synthetic=holes >/dev/null 2>&1
apparent=$(du -s --apparent-size -B1 "$T/holes" | cut -f1); used=$(du -s -B1 "$T/holes" | cut -f1)
expect_ok    "holes leave the matrices unwritten" test "$used" -lt "$((apparent / 2))"
expect_ok    "holes checkpoint on the cpu" "$BIN" logits -m "$T/holes" --tokens 1
expect_err   "synthetic budget not a number" "DSV4_SYNTHETIC_HOST_GB: expected a number" env DSV4_SYNTHETIC_HOST_GB=lots "$BIN" logits -m "$T/holes" --tokens 1
expect_err   "synthetic budget too small" "other than the routed experts take" env DSV4_SYNTHETIC_HOST_GB=0.000001 "$BIN" logits -m "$T/holes" --tokens 1

# damaged checkpoints reach the engine commands with the same precise messages as inspect
cp -r "$M" "$T/trunc"
shard=$(ls "$T/trunc"/model-0000*-of-*.safetensors | head -1)
truncate -s -1000 "$shard"
expect_err   "truncated shard"         "truncated" "$BIN" logits -m "$T/trunc" --tokens 1
cp -r "$M" "$T/badjson"
printf '{"vocab_size": 512, ' >"$T/badjson/config.json"
expect_err   "malformed config"        "malformed JSON" "$BIN" generate -m "$T/badjson" --tokens 1 --ids

finish
