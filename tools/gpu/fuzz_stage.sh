#!/usr/bin/env bash
# Stage the fuzz targets for the lent GPU machine in .fuzz/ (ignored; sent with the device tool's `carry`, next to
# .gpu/). tools/gpu/fuzz_bg.sh runs them there in the background of a GPU job (tests/fuzz/README.md, "Long runs").
#
# One program holds every target (`make fuzz-all`: tests/fuzz/multi/main.c picks one by DSV4_FUZZ_TARGET), a
# baseline x86-64-v3 clang build with libFuzzer, ASan and UBSan (their runtimes are linked statically by clang),
# jansson / PCRE2 / xxhash statically (the GPU machine has none of them); it needs only libc, libm, libstdc++
# and libgcc_s, which every machine there has. Kept with its debug information (stack traces with lines where
# that machine has addr2line) and xz-compressed: about 1.2 MB. The corpora, dictionaries and options travel with
# the checkout (tests/fuzz/), so a run starts from whatever tests/fuzz/corpus holds then, merged runs included.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -j"${JOBS:-2}" fuzz-all >/dev/null
bin=build-fuzz-all/fuzzers/fuzz_all
extra=$(ldd "$bin" | awk '/=>/ {print $1}' | grep -v -E '^(libc|libm|libstdc\+\+|libgcc_s)\.so' || true)
if [ -n "$extra" ]; then echo "fuzz_stage: $bin needs libraries the GPU machine may lack: $extra" >&2; exit 1; fi
rm -rf .fuzz && mkdir -p .fuzz
# without its debug information and xz-compressed (1.2 MB instead of 2.2 with gzip -g): the carry limit is
# tight with .gpu/. Symbols stay (function names); for lines, symbolize the offsets of a report here against
# the unstripped build-fuzz-all/fuzzers/fuzz_all (the same sha256 as in .fuzz/STAGED), or replay the input.
strip --strip-debug -o .fuzz/fuzz_all "$bin"
xz -9 -T1 .fuzz/fuzz_all
# what the results are measured against: tools/fuzz_merge.sh warns when it merges a run of another revision
{
    echo "revision $(git rev-parse HEAD)$([ -z "$(git status --porcelain -- src include tests/fuzz Makefile)" ] || echo " (with uncommitted changes)")"
    echo "staged $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "sha256 $(sha256sum "$bin" | cut -d' ' -f1)"
} >.fuzz/STAGED
# the device tool carries at most 64 MiB: the checkout (tracked and untracked files), .gpu/ and .fuzz/ together
mib() { echo "$(( ($1 + 1048575) / 1048576 ))"; }
tree_b=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
fuzz_b=$(du -sb .fuzz | cut -f1)
gpu_b=$( [ -d .gpu ] && du -sb .gpu | cut -f1 || echo 0)
total_b=$((tree_b + fuzz_b + gpu_b))
echo "fuzz_stage: .fuzz $(( fuzz_b / 1024 )) KiB; with the checkout ($(mib "$tree_b") MiB) and .gpu ($(mib "$gpu_b") MiB): $(( total_b / 1024 )) KiB of 65536"
if [ "$total_b" -gt $((63 * 1048576)) ]; then echo "fuzz_stage: within 1 MiB of the 64 MiB carry limit: carry less" >&2; exit 1; fi
