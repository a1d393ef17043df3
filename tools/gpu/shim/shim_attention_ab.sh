#!/usr/bin/env bash
# The same bits from two builds of the chunked attention kernels, on the CPU (tools/gpu/shim/shim_attention.sh): runs
# tests/gpu/test_gpu_attention.c against build A and build B with ATT_TEST_DUMP (every output of every step, in
# order) and compares the dumps byte for byte. Each build must also pass the test itself.
#   SHIM_AB_REF=<commit>: A = the kernel sources of that commit (src/backend/cuda/ of it), B = the working tree's;
#   otherwise A = the working tree built with SHIM_AB_FLAGS_A (default: the grid before the head split,
#   -DATT_SHG=64 -DATT_SDS=64), B = the working tree as it is (SHIM_AB_FLAGS_B, default none).
# Slow: two shim runs (~3-4 min each with SHIM_QUICK=1, the default). Needs `make` (build/libdsv4.a).
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim-ab}
mkdir -p "$D"
rm -f "$D/a.dump" "$D/b.dump"
if [ -n "${SHIM_AB_REF:-}" ]; then
    mkdir -p "$D/ref/backend/cuda"
    for f in k_attention.cu cu_common.cuh cu_kvrow.cuh cu_rope.cuh; do
        git show "$SHIM_AB_REF:src/backend/cuda/$f" > "$D/ref/backend/cuda/$f"
    done
    echo "== A: the kernels of $SHIM_AB_REF"
    SHIM_DIR="$D/a" SHIM_SRC="$D/ref" SHIM_CFLAGS="${SHIM_AB_FLAGS_A:-}" ATT_TEST_DUMP="$D/a.dump" \
        bash tools/gpu/shim/shim_attention.sh > "$D/a.log" 2>&1 || { tail -20 "$D/a.log"; echo "A failed"; exit 1; }
else
    echo "== A: the working tree with ${SHIM_AB_FLAGS_A--DATT_SHG=64 -DATT_SDS=64}"
    SHIM_DIR="$D/a" SHIM_CFLAGS="${SHIM_AB_FLAGS_A--DATT_SHG=64 -DATT_SDS=64}" ATT_TEST_DUMP="$D/a.dump" \
        bash tools/gpu/shim/shim_attention.sh > "$D/a.log" 2>&1 || { tail -20 "$D/a.log"; echo "A failed"; exit 1; }
fi
grep -c "^\[       OK \]" "$D/a.log" | sed 's/^/   tests passed: /'
echo "== B: the working tree${SHIM_AB_FLAGS_B:+ with $SHIM_AB_FLAGS_B}"
SHIM_DIR="$D/b" SHIM_CFLAGS="${SHIM_AB_FLAGS_B:-}" ATT_TEST_DUMP="$D/b.dump" \
    bash tools/gpu/shim/shim_attention.sh > "$D/b.log" 2>&1 || { tail -20 "$D/b.log"; echo "B failed"; exit 1; }
grep -c "^\[       OK \]" "$D/b.log" | sed 's/^/   tests passed: /'
[ -s "$D/a.dump" ] || { echo "A wrote no outputs"; exit 1; }
if cmp "$D/a.dump" "$D/b.dump"; then
    echo "same bits: $(stat -c %s "$D/a.dump") bytes of outputs (every step of the test) equal"
else
    echo "the outputs differ"
    exit 1
fi
