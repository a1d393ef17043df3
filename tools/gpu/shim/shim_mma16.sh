#!/usr/bin/env bash
# Runs tests/gpu/test_gpu_mma16.c on the CPU against the very source of the BF16-input tensor-core linear (k_mma16.cu:
# its kernels and launchers), through tools/gpu/shim/cuda_shim.h: the fragment layouts of mma.m16n8k16 .bf16 as the
# PTX ISA defines them (shim_mma_bf16), every GPU thread a fiber. Checks the kernel's loads, k maps, tiles, group
# offsets and the partial-sum order without a GPU; the PTX section (mma, cvt) is replaced by C++ of the same
# definitions, so the conversions themselves are checked only on the GPU. Needs `make` (build/libdsv4.a). ~1-3 min.
# MMA16_BUG=1 builds with -DDSV4_MMA16_BUG (must fail). Not part of `make test` nor of the GPU suite.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim-mma16}
mkdir -p "$D"
python3 - "$D/mma16_kernels.cpp" <<'PY'
import re, sys
sys.path.insert(0, "tools/gpu/shim")
from shim_src import poison_shared, launches
src = open("src/backend/cuda/k_mma16.cu").read()
common = open("src/backend/cuda/cu_common.cuh").read()
out = ['#include "cuda_shim.h"', '#include <algorithm>', '#include <climits>', 'using std::min;',
       'extern "C" {', '#include "util/error.h"', '}', '#include "backend/cuda/cu_mma.h"', '#include "dsv4.h"',
       'static inline int cu_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }']
a = common.index("/* ---- number formats"); b = common.index("/* ---- reductions")
out.append(common[a:b])
a = src.index("#define MMA16_PARTS"); b = src.index("/* ---- PTX")
out.append(src[a:b])   # the split and the bug switch
# the PTX section, as C++ of the same definitions
out.append('''
static inline void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    shim_mma_bf16(d, a0, a1, a2, a3, b0, b1);
}
static inline uint32_t bf16x2_of(float lo, float hi) { return (uint32_t)dev_f32_to_bf16(lo) | (uint32_t)dev_f32_to_bf16(hi) << 16; }
static inline uint32_t e4m3x2_bf16x2(uint32_t v) {   /* every E4M3 value is a bf16: its float's top 16 bits */
    return __float_as_uint(dev_e4m3((uint8_t)v)) >> 16 | (__float_as_uint(dev_e4m3((uint8_t)(v >> 8))) & 0xffff0000u);
}
''')
a = src.index("/* ---- the kernels ---- */")
body = src[a:]
body = poison_shared(body)
n0 = body.count("<<<")
body, _ = launches(body, r"k_mma16_\w+(?:<[^<>;]*>)?")
assert n0 == 2 and "<<<" not in body, n0
out.append(body)
open(sys.argv[1], "w").write("\n".join(out))
PY
BUG=
[ "${MMA16_BUG:-0}" = 1 ] && BUG=-DDSV4_MMA16_BUG
g++ -O2 -std=c++17 -w $BUG -DMMA16_SHIM -Iinclude -Isrc -Itools/gpu/shim -c "$D/mma16_kernels.cpp" -o "$D/mma16_kernels.o"
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
cc -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -DMMA16_TEST_SHIM -Iinclude -Isrc -Itests/gpu \
    -c tests/gpu/test_gpu_mma16.c -o "$D/test.o"
g++ -o "$D/test_gpu_mma16_shim" "$D/test.o" "$D/mma16_kernels.o" "$D/cuda_shim.o" build/libdsv4.a \
    -lcmocka -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
"$D/test_gpu_mma16_shim"
