#!/usr/bin/env bash
# Build the CUDA binaries for the lent GPU machine and stage them in .gpu/ (ignored; sent with the device
# tool's `carry`). That machine has no jansson / PCRE2 / xxhash / cmocka: those are linked statically except
# cmocka (no static archive in Debian), whose shared library is staged beside the tests. A baseline x86-64-v3
# build (AVX2, FMA, F16C) runs on any H200 host. The shared test data (../shared/testdata) does not travel with
# the checkout, so the parts the GPU tests read are copied too.
set -euo pipefail
cd "$(dirname "$0")/../.."
make CUDA=1 BUILD=build-gpu OPT="-O2 -march=x86-64-v3" STATIC_DEPS=1 -j"$(nproc)" all >/dev/null
rm -rf .gpu && mkdir -p .gpu/gputests .gpu/lib .gpu/testdata
strip -o .gpu/dsv4 build-gpu/dsv4
for t in build-gpu/gputests/test_*; do strip -o ".gpu/gputests/$(basename "$t")" "$t"; done
cp -L /usr/lib/x86_64-linux-gnu/libcmocka.so.0 .gpu/lib/
cp -r ../shared/testdata/official ../shared/testdata/official_calm .gpu/testdata/
du -sh .gpu
