#!/usr/bin/env bash
# dsv4 tiny + dsv4 inspect from the command line: both presets (and both speculative heads) are written and
# inspected cleanly; then damaged checkpoints (index entry removed, shard truncated, malformed config, wrong
# dtype, wrong shape, missing tensor, NaN scale, duplicate hash experts, ...) must each make `dsv4 inspect`
# exit non-zero (never by a signal) with a one-line message naming the tensor or file.
# Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"

# A fresh copy of the good flash checkpoint to damage.
fresh() { rm -rf "$T/bad"; cp -r "$T/flash" "$T/bad"; }
# The config.json of the flash preset with one override, installed over the damaged copy's config.
config_with() { rm -rf "$T/cfg"; "$BIN" tiny -o "$T/cfg" --set "$1" 2>/dev/null && cp "$T/cfg/config.json" "$T/bad/config.json"; }
# Byte offset (from file start) of a tensor's data in a shard: 8 + header length + data_offsets[0].
data_offset() {
    perl -e 'open(F, "<", $ARGV[0]) or die; binmode F; read(F, $l, 8); $n = unpack("Q<", $l); read(F, $h, $n);
             $h =~ /"\Q$ARGV[1]\E":\{[^}]*"data_offsets":\[(\d+),/ or die "no tensor"; print 8 + $n + $1' "$1" "$2"
}
shard_of() { grep -F "\"$2\":" "$1/model.safetensors.index.json" | sed -E 's/.*: "([^"]+)".*/\1/'; }

# ---- good checkpoints ------------------------------------------------------------------------------------
expect_ok "tiny flash-tiny" "$BIN" tiny -o "$T/flash" --preset flash-tiny --seed 1
expect_ok "inspect flash-tiny" "$BIN" inspect -m "$T/flash"
grep -q "problems: none" "$T/out" && ok || bad "inspect flash-tiny: no 'problems: none'"
grep -q "layers: 0:SWA/hash 1:SWA/hash 2:CSA 3:HCA 4:CSA 5:HCA" "$T/out" && ok || bad "inspect flash-tiny: layer line"
grep -q "per context token: 130 values" "$T/out" && ok || bad "inspect flash-tiny: kv per token"
expect_ok "tiny pro-tiny" "$BIN" tiny -o "$T/pro" --preset pro-tiny --seed 2 --shards 3
expect_ok "inspect pro-tiny" "$BIN" inspect -m "$T/pro"
grep -q "layers: 0:HCA/hash 1:HCA/hash 2:CSA/hash 3:HCA" "$T/out" && ok || bad "inspect pro-tiny: layer line"
expect_ok "tiny --mtp v4" "$BIN" tiny -o "$T/v4" --mtp v4
expect_ok "inspect v4" "$BIN" inspect -m "$T/v4"
grep -q "speculative heads: v4 mtp" "$T/out" && ok || bad "inspect v4: head not detected"
expect_ok "tiny --mtp dspark" "$BIN" tiny -o "$T/dspark" --preset pro-tiny --mtp dspark
expect_ok "inspect dspark" "$BIN" inspect -m "$T/dspark"
grep -q "speculative heads: dspark" "$T/out" && ok || bad "inspect dspark: head not detected"
expect_ok "tiny --set" "$BIN" tiny -o "$T/small" --set 'compress_ratios=[0,4,128]' --set sliding_window=8
expect_ok "inspect --set" "$BIN" inspect -m "$T/small"
grep -q "window 8" "$T/out" && ok || bad "inspect --set: window not 8"
OFFICIAL="${DSV4_ROOT:-.}/../shared/testdata/official/flashlike/checkpoint"
if [ -d "$OFFICIAL" ]; then expect_ok "inspect the official example" "$BIN" inspect -m "$OFFICIAL"; fi

# ---- bad command lines -------------------------------------------------------------------------------------
expect_err "tiny without -o" "missing -o" "$BIN" tiny
expect_err "tiny bad --mtp" "--mtp" "$BIN" tiny -o "$T/x" --mtp v5
expect_err "tiny bad --set" "compress_ratios[1]" "$BIN" tiny -o "$T/x" --set 'compress_ratios=[0,5]'
expect_err "tiny bad JSON value" "not valid JSON" "$BIN" tiny -o "$T/x" --set 'hidden_size=[1,'
expect_err "tiny bad --seed" "--seed" "$BIN" tiny -o "$T/x" --seed -3
expect_err "inspect without -m" "missing -m" "$BIN" inspect
expect_err "inspect no folder" "$T/nothing" "$BIN" inspect -m "$T/nothing"

# ---- damaged checkpoints -----------------------------------------------------------------------------------
fresh; sed -i '/"layers.3.attn.attn_sink":/d' "$T/bad/model.safetensors.index.json"
expect_err "tensor deleted from the index" "layers.3.attn.attn_sink" "$BIN" inspect -m "$T/bad"

fresh; sed -i 's/"layers.1.attn.wkv.weight": "model-00001/"layers.1.attn.wkv.weightX": "model-00001/' "$T/bad/model.safetensors.index.json"
expect_err "index names an absent tensor" "layers.1.attn.wkv.weightX" "$BIN" inspect -m "$T/bad"

fresh; truncate -s -1000 "$T/bad/model-00002-of-00002.safetensors"
expect_err "truncated shard" "model-00002-of-00002.safetensors" "$BIN" inspect -m "$T/bad"
grep -q "truncated" "$T/err" && ok || bad "truncated shard: message does not say truncated"

fresh; truncate -s 4 "$T/bad/model-00001-of-00002.safetensors"
expect_err "shard shorter than its header length" "model-00001-of-00002.safetensors" "$BIN" inspect -m "$T/bad"

fresh; printf '\xff\xff\xff\xff\x00\x00\x00\x00{}' >"$T/bad/model-00001-of-00002.safetensors"
expect_err "absurd header length" "model-00001-of-00002.safetensors" "$BIN" inspect -m "$T/bad"

fresh; rm "$T/bad/model-00002-of-00002.safetensors"
expect_err "missing shard" "model-00002-of-00002.safetensors" "$BIN" inspect -m "$T/bad"

fresh; printf '{"vocab_size": 512, "hidden_size":' >"$T/bad/config.json"
expect_err "malformed config JSON" "config.json" "$BIN" inspect -m "$T/bad"

fresh; printf '{"metadata": {}, "weight_map": ' >"$T/bad/model.safetensors.index.json"
expect_err "malformed index JSON" "model.safetensors.index.json" "$BIN" inspect -m "$T/bad"

fresh; rm "$T/bad/config.json"
expect_err "missing config" "config.json" "$BIN" inspect -m "$T/bad"

fresh; config_with num_hash_layers=3
expect_err "missing tensor (config wants a hash table)" "layers.2.ffn.gate.tid2eid" "$BIN" inspect -m "$T/bad"

fresh; config_with moe_intermediate_size=64
expect_err "wrong shape" "has shape" "$BIN" inspect -m "$T/bad"
grep -q "expected \[64" "$T/err" && ok || bad "wrong shape: message lacks the expected shape: $(cat "$T/err")"

fresh; config_with expert_dtype=fp8
expect_err "wrong dtype (config says fp8 experts)" "layers.0.ffn.experts.0.w1.weight has dtype I8, expected F8_E4M3" "$BIN" inspect -m "$T/bad"

# wrong dtype in a shard header: F32 -> I32 keeps the byte count, so only the dtype check can catch it
fresh; f=$(shard_of "$T/bad" layers.0.attn.attn_sink)
perl -0777 -pi -e 's/"layers\.0\.attn\.attn_sink":\{"dtype":"F32"/"layers.0.attn.attn_sink":{"dtype":"I32"/' "$T/bad/$f"
expect_err "wrong dtype in header" "layers.0.attn.attn_sink has dtype I32" "$BIN" inspect -m "$T/bad"

# unknown dtype string in a shard header
fresh; f=$(shard_of "$T/bad" layers.0.attn.attn_sink)
perl -0777 -pi -e 's/"layers\.0\.attn\.attn_sink":\{"dtype":"F32"/"layers.0.attn.attn_sink":{"dtype":"Q32"/' "$T/bad/$f"
expect_err "unknown dtype in header" "layers.0.attn.attn_sink" "$BIN" inspect -m "$T/bad"

# a NaN (0xff) UE8M0 scale byte
fresh; f=$(shard_of "$T/bad" layers.0.attn.wq_a.scale); off=$(data_offset "$T/bad/$f" layers.0.attn.wq_a.scale)
printf '\xff' | dd of="$T/bad/$f" bs=1 seek="$off" conv=notrunc status=none
expect_err "NaN scale byte" "layers.0.attn.wq_a.scale" "$BIN" inspect -m "$T/bad"

# a hash-routing row that lists the same expert twice: copy entry 0 of token 0 over entry 1
fresh; f=$(shard_of "$T/bad" layers.1.ffn.gate.tid2eid); off=$(data_offset "$T/bad/$f" layers.1.ffn.gate.tid2eid)
dd if="$T/bad/$f" of="$T/row0" bs=1 skip="$off" count=4 status=none
dd if="$T/row0" of="$T/bad/$f" bs=1 seek=$((off + 4)) conv=notrunc status=none
expect_err "duplicate expert in tid2eid" "layers.1.ffn.gate.tid2eid" "$BIN" inspect -m "$T/bad"

# an expert id outside the routed experts
fresh; f=$(shard_of "$T/bad" layers.0.ffn.gate.tid2eid); off=$(data_offset "$T/bad/$f" layers.0.ffn.gate.tid2eid)
printf '\x63\x00\x00\x00' | dd of="$T/bad/$f" bs=1 seek="$off" conv=notrunc status=none
expect_err "expert id out of range" "layers.0.ffn.gate.tid2eid" "$BIN" inspect -m "$T/bad"

# v4 MTP tensors present but the config has no MTP layer
rm -rf "$T/bad"; cp -r "$T/v4" "$T/bad"; cp "$T/flash/config.json" "$T/bad/config.json"
expect_err "mtp tensors without mtp config" "MTP" "$BIN" inspect -m "$T/bad"

finish
