#!/usr/bin/env bash
# The CPU's numbers are the source's, not the compiler's. The Makefile builds every C file with
# -ffp-contract=off (the only FMAs are the fmaf the code writes), the kernels of src/backend/cpu/isa/ are chosen
# at run time whatever -march says, and the shared inline helpers (dot_f32 ...) give the same order in their
# AVX-512, AVX2 and scalar forms. So a second build of dsv4 with other flags must give the same bytes:
# `-O1 -march=x86-64-v2` (a different optimizer; no AVX and no FMA unit, so every fmaf outside the kernels is
# a library call and every inline helper takes its scalar form; CPU-only whatever make was given) against $BIN
# (the suite's build, -O3 -march=native by default). Compared by cmp: the logits of a flash-like and a pro-like tiny
# model in both modes, f32 and fp8 KV, one-shot and chunked; sampled generation with the MTP and DSpark drafters
# (ids and acceptance counts).
# Before -ffp-contract=off, GCC fused a * b + c wherever its passes saw one, so the builds differed (hc_pre's
# mixes, the P.V accumulation, the YaRN table; a vectorised loop's body and its remainder could even differ).
. "$(dirname "$0")/lib.sh"
ROOT=${DSV4_ROOT:-.}
OTHER=$T/build-v2/dsv4

if make -s -j2 -C "$ROOT" CUDA=0 BUILD="$T/build-v2" OPT="-O1 -march=x86-64-v2" "$OTHER" >"$T/make.log" 2>&1; then ok
else bad "the -O1 -march=x86-64-v2 build failed: $(grep -m3 -E 'error|Error' "$T/make.log")"; finish; exit; fi

# same NAME CMD-ARGS...: both binaries with the same arguments; their stdout and files under $T/a, $T/b equal
same() {
    local name=$1; shift
    rm -rf "$T/a" "$T/b"; mkdir -p "$T/a" "$T/b"
    local ra rb
    "$BIN" "${@//@OUT@/$T/a}" >"$T/a/stdout" 2>"$T/a/stderr"; ra=$?
    "$OTHER" "${@//@OUT@/$T/b}" >"$T/b/stdout" 2>"$T/b/stderr"; rb=$?
    # generate --stats: keep the counts, drop the timings
    for d in a b; do grep -v -E "^prefill:|tok/s" "$T/$d/stderr" >"$T/$d/counts"; rm "$T/$d/stderr"; done
    if [ $ra -ne 0 ] || [ $rb -ne 0 ]; then bad "$name: exit $ra / $rb"
    elif diff -r -q "$T/a" "$T/b" >/dev/null; then ok
    else bad "$name: the builds differ: $(cd "$T" && diff -r -q a b | head -3 | tr "\n" " ")"; fi
}

"$BIN" tiny -o "$T/flash" --preset flash-tiny --mtp v4 --seed 7 >/dev/null 2>&1 || bad "tiny flash"
"$BIN" tiny -o "$T/pro" --preset pro-tiny --mtp dspark --seed 8 >/dev/null 2>&1 || bad "tiny pro"
IDS=$(seq -s, 3 7 250)   # 36 ids
for model in flash pro; do
    for mode in exact official; do
        for kv in f32 fp8; do
            same "$model $mode $kv one-shot" logits -m "$T/$model" --tokens "$IDS" --mode $mode --kv $kv --threads 2 --out @OUT@/l.npy
            same "$model $mode $kv chunked" logits -m "$T/$model" --tokens "$IDS" --mode $mode --kv $kv --threads 2 --chunks 5,11 --out @OUT@/l.npy
        done
    done
done
for mode in exact official; do
    same "flash $mode sampled, mtp" generate -m "$T/flash" --tokens 5,6,7,8,9,10 -n 24 --temp 0.8 --seed 3 --spec mtp --ids --stats --mode $mode
    same "pro $mode sampled, dspark" generate -m "$T/pro" --tokens 5,6,7,8,9,10 -n 24 --temp 0.8 --seed 3 --spec dspark --ids --stats --mode $mode
done
finish
