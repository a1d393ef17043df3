#!/usr/bin/env bash
# `dsv4 generate --prefix-cache-dir DIR` (issue 4): a second process reuses the stored prompt state from disk and
# prints exactly the ids of a cold run; a damaged cache file is rejected, removed and recomputed (same ids);
# a file of another model is never used. Run from the repository root with DSV4_BIN set.
. "$(dirname "$0")/lib.sh"
"$BIN" tiny -o "$T/m" --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 \
    --set index_topk=3 >/dev/null 2>&1 || { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }
P=$(seq -s, 3 162)
cold=$("$BIN" generate -m "$T/m" --tokens "$P" -n 12 --ids 2>/dev/null)
run() { "$BIN" generate -m "$T/m" --tokens "$P" -n 12 --ids --prefix-cache-dir "$T/pc" --prefix-cache-mb 64 --stats 2>"$T/stats"; }

out=$(run); [ "$out" = "$cold" ] && ok || bad "first cached run differs from the cold run"
grep -q "1 disk write" "$T/stats" && ok || bad "first run did not store its prompt: $(cat "$T/stats")"
out=$(run); [ "$out" = "$cold" ] && ok || bad "second run (disk hit) differs from the cold run"
grep -q "1 disk hit" "$T/stats" && grep -q "reused 159 prompt tokens" "$T/stats" && ok || bad "no disk hit: $(cat "$T/stats")"

f=$(ls "$T"/pc/*.dsv4seq)
printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") / 2 )) conv=notrunc 2>/dev/null
out=$(run); [ "$out" = "$cold" ] && ok || bad "run after damage differs from the cold run"
grep -q "1 rejected" "$T/stats" && ok || bad "damaged file not rejected: $(cat "$T/stats")"

# another model's process fills the same folder: never used here (different fingerprint in the name)
"$BIN" tiny -o "$T/m2" --preset flash-tiny --seed 7 --set sliding_window=16 >/dev/null 2>&1
"$BIN" generate -m "$T/m2" --tokens "$P" -n 2 --ids --prefix-cache-dir "$T/pc" >/dev/null 2>&1
out=$(run); [ "$out" = "$cold" ] && ok || bad "run beside another model's files differs"
expect_err "bad budget" "--prefix-cache-mb" "$BIN" generate -m "$T/m" --tokens 1,2 --prefix-cache-dir "$T/pc" --prefix-cache-mb 0
finish
