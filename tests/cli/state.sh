#!/usr/bin/env bash
# Sequence state files across processes (issue 4): `dsv4 logits --save-at K --state F` in one process and
# `dsv4 logits --resume F` in another give, together, exactly the logits of a one-shot run (cmp of the .npy
# data parts), at every class of K (s < 4, each s mod 4, 127/128/129 on the ratio-128 layers, past the
# window). Then `dsv4 state inspect`, and damaged / foreign / mismatched states: one-line errors, no signal.
# Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"

# The data part of a .npy file (v1 header: 10 bytes + little-endian u16 header length).
npy_data() {
    local hlen
    hlen=$(od -An -tu2 -j8 -N2 "$1" | tr -d ' ')
    tail -c +$((10 + hlen + 1)) "$1"
}

N=270
TOK=$(awk -v n=$N 'BEGIN { s = 12345; for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648;
      printf "%s%d", (i ? "," : ""), int(s / 65536) % 512 } }')
SETS=(--set "compress_ratios=[0,0,4,128,4,128]" --set "sliding_window=8" --set "index_topk=3")
expect_ok "tiny" "$BIN" tiny -o "$T/m" --seed 7 "${SETS[@]}"
expect_ok "one-shot" "$BIN" logits -m "$T/m" --tokens "$TOK" --out "$T/full.npy"
npy_data "$T/full.npy" >"$T/full.bin"

for K in 0 1 2 3 4 5 6 7 8 9 17 126 127 128 129 130 131 255 256 257 269 270; do
    rm -f "$T/s.bin" "$T/a.npy" "$T/b.npy"
    expect_ok "save at $K" "$BIN" logits -m "$T/m" --tokens "$TOK" --save-at $K --state "$T/s.bin" --out "$T/a.npy"
    expect_ok "resume at $K" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/s.bin" --out "$T/b.npy"
    cat <(npy_data "$T/a.npy") <(npy_data "$T/b.npy") >"$T/ab.bin"
    if cmp -s "$T/ab.bin" "$T/full.bin"; then ok; else bad "save at $K + resume: logits differ from the one-shot run"; fi
done

# resume with chunked processing, and a chain: save at 5, resume to 131 and save, resume to the end
expect_ok "save 100" "$BIN" logits -m "$T/m" --tokens "$TOK" --save-at 100 --state "$T/s100.bin"
expect_ok "resume chunked" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/s100.bin" --chunks 3,1,40 --out "$T/c.npy"
cmp -s <(npy_data "$T/c.npy") <(tail -c +$((100 * 512 * 4 + 1)) "$T/full.bin") && ok || bad "chunked resume differs"
expect_ok "chain 1" "$BIN" logits -m "$T/m" --tokens "$TOK" --save-at 5 --state "$T/c1.bin" --out "$T/c1.npy"
expect_ok "chain 2" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/c1.bin" --save-at 131 --state "$T/c2.bin" --out "$T/c2.npy"
expect_ok "chain 3" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/c2.bin" --out "$T/c3.npy"
cmp -s <(cat <(npy_data "$T/c1.npy") <(npy_data "$T/c2.npy") <(npy_data "$T/c3.npy")) "$T/full.bin" && ok || bad "chained resumes differ"

# state inspect
expect_ok "inspect" "$BIN" state inspect "$T/s100.bin"
grep -q "position: 100 tokens" "$T/out" && ok || bad "inspect: position line"
grep -q "checksum ok" "$T/out" && ok || bad "inspect: checksum line"
grep -q "layer  3 HCA m=128 compressed rows 0" "$T/out" && ok || bad "inspect: HCA layer line"
grep -q "bytes per context token: " "$T/out" && ok || bad "inspect: bytes per token"

# damaged and foreign states
LEN=$(stat -c %s "$T/s100.bin")
for OFF in 0 9 13 20 50 60 400 $((LEN / 2)) $((LEN - 3)); do
    cp "$T/s100.bin" "$T/bad.bin"
    printf '\x5a' | dd of="$T/bad.bin" bs=1 seek=$OFF conv=notrunc status=none
    cmp -s "$T/bad.bin" "$T/s100.bin" && { printf '\xa5' | dd of="$T/bad.bin" bs=1 seek=$OFF conv=notrunc status=none; }
    expect_err "resume byte $OFF damaged" "state" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/bad.bin"
    expect_err "inspect byte $OFF damaged" "s" "$BIN" state inspect "$T/bad.bin"
done
head -c $((LEN - 1)) "$T/s100.bin" >"$T/trunc.bin"
expect_err "truncated" "truncated" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/trunc.bin"
cat "$T/s100.bin" <(printf 'x') >"$T/long.bin"
expect_err "trailing garbage" "trailing" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/long.bin"
expect_err "not a state" "magic" "$BIN" state inspect "$T/full.npy"
expect_err "missing file" "nonexistent" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/nonexistent.bin"
expect_ok "tiny window 16" "$BIN" tiny -o "$T/m16" --seed 7 --set "compress_ratios=[0,0,4,128,4,128]" --set "sliding_window=16" --set "index_topk=3"
expect_err "other model" "another model" "$BIN" logits -m "$T/m16" --tokens "$TOK" --resume "$T/s100.bin"
expect_err "other mode" "mode" "$BIN" logits -m "$T/m" --mode official --tokens "$TOK" --resume "$T/s100.bin"
expect_err "not a prefix" "not a prefix" "$BIN" logits -m "$T/m" --tokens "1,2,3,${TOK#*,*,*,}" --resume "$T/s100.bin"
expect_err "too few tokens" "more than" "$BIN" logits -m "$T/m" --tokens "1,2,3" --resume "$T/s100.bin"
expect_err "save-at without state" "--state" "$BIN" logits -m "$T/m" --tokens "$TOK" --save-at 3
expect_err "save-at beyond" "beyond" "$BIN" logits -m "$T/m" --tokens "1,2" --save-at 3 --state "$T/x.bin"
expect_err "save-at before resume" "before" "$BIN" logits -m "$T/m" --tokens "$TOK" --resume "$T/s100.bin" --save-at 50 --state "$T/x.bin"
expect_err "inspect usage" "usage" "$BIN" state
expect_err "unknown subcommand" "unknown" "$BIN" state frobnicate

echo "state: $pass passed, $fail failed"
[ "$fail" = 0 ]
