#!/usr/bin/env bash
# dsv4 --version (issue 19): the header's version, the git commit the binary was built from ("unknown" outside a
# checkout), the build options; and the same version and commit recorded as the writer of a saved state and of a
# prefix-cache file.
# Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"
ROOT=${DSV4_ROOT:-.}

want=$(sed -n 's/^#define DSV4_VERSION "\(.*\)"$/\1/p' "$ROOT/include/dsv4.h")
[ -n "$want" ] && ok || bad "no DSV4_VERSION in include/dsv4.h"
expect_ok "--version" "$BIN" --version
cp "$T/out" "$T/v"
[ "$(sed -n 1p "$T/v")" = "dsv4 $want" ] && ok || bad "first line '$(sed -n 1p "$T/v")', want 'dsv4 $want'"
commit=$(sed -n 's/^commit: //p' "$T/v")
if git -C "$ROOT" rev-parse HEAD >/dev/null 2>&1 && [ -e "$ROOT/.git" ]; then
    head=$(git -C "$ROOT" rev-parse --short=12 HEAD)
    [ "${commit%-dirty}" = "$head" ] && ok || bad "commit '$commit', the checkout is at $head (stale build?)"
else
    [ "$commit" = unknown ] && ok || bad "outside git the commit should be unknown, got '$commit'"
fi
grep -qE '^build: cuda (yes|no); cpu [a-z0-9-]+( [a-z0-9]+)*; ' "$T/v" && ok || bad "build line: $(sed -n 3p "$T/v")"
[ "$(wc -l <"$T/v")" -eq 3 ] && ok || bad "--version prints $(wc -l <"$T/v") lines, want 3"

# a state file names this build as its writer
expect_ok "tiny" "$BIN" tiny -o "$T/m" --set "compress_ratios=[0,4]" --set num_hidden_layers=2
expect_ok "save" "$BIN" logits -m "$T/m" --tokens 1,2,3,4,5 --save-at 5 --state "$T/s.bin"
expect_ok "state inspect" "$BIN" state inspect "$T/s.bin"
grep -qxF "written by: dsv4 $want (commit $commit)" "$T/out" && ok || bad "inspect: $(grep 'written by' "$T/out")"
grep -qx "format: dsv4 sequence state v2, checksum ok (xxh64)" "$T/out" && ok || bad "inspect: $(grep 'format' "$T/out")"
# so does a prefix-cache file (the same state format)
expect_ok "generate with a prefix cache" "$BIN" generate -m "$T/m" --tokens 1,2,3,4,5,6 -n 2 --ids --prefix-cache-dir "$T/pc"
f=$(ls "$T"/pc/p-*.dsv4seq 2>/dev/null | head -1)
[ -n "$f" ] && ok || bad "no prefix-cache file written"
expect_ok "inspect a prefix-cache file" "$BIN" state inspect "$f"
grep -qxF "written by: dsv4 $want (commit $commit)" "$T/out" && ok || bad "prefix-cache file: $(grep 'written by' "$T/out")"
finish
