#!/usr/bin/env bash
# Runs tests/gpu/test_gpu_gemm.c on the CPU against the very source of the FP8/FP4 tensor-core linears: the large-T
# GEMM (k_mma_gemm.cu) and the small-tile kernels it must match bit for bit (k_mma.cu), through
# tools/gpu/shim/cuda_shim.h, every GPU thread a fiber. The inline assembly is replaced by C++ of the same
# definitions: mma.m16n8k32 .e4m3 from the PTX ISA's fragment layout (below, written from the ISA, not from the
# kernels), prmt by its definition, cp.async as a plain copy (or zero fill) done at once, its groups' waits as
# no-ops. Checks the stage layout, the fragment loads, the chunk walk and the fold order of the GEMM against the
# small-tile kernels' order without a GPU; the pipelining itself (a buffer refilled while a warp still reads it)
# and the instructions are checked only on the GPU (the same test there). Needs `make` (build/libdsv4.a). ~1 min.
# GEMM_BUG=1 / GEMM_BUG=2 build with -DDSV4_GEMM_BUG=1 / 2 (must fail). Not part of `make test` nor of the GPU suite.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim-gemm}
mkdir -p "$D"
python3 - "$D/gemm_kernels.cpp" <<'PY'
import re, sys
sys.path.insert(0, "tools/gpu/shim")
from shim_src import poison_shared, launches

def strip_asm(text):
    """Every __device__ function whose body holds inline assembly, removed (the preamble defines them in C++)."""
    out, pos = [], 0
    for m in re.finditer(r"(?:template <[^>]*>\s*)?__device__ __forceinline__[^;{]*?\b(\w+)\s*\([^{;]*\)\s*\{", text):
        if m.start() < pos: continue
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if "asm" in text[m.end():i]:
            out.append(text[pos:m.start()])
            pos = i
    out.append(text[pos:])
    return "".join(out)

common = open("src/backend/cuda/cu_common.cuh").read()
quant = open("src/backend/cuda/cu_quant.cuh").read()
frag = open("src/backend/cuda/cu_mma_frag.cuh").read()
mma = open("src/backend/cuda/k_mma.cu").read()
gemm = open("src/backend/cuda/k_mma_gemm.cu").read()
out = ['#include "cuda_shim.h"', '#include <algorithm>', '#include <climits>', 'using std::min;',
       'extern "C" {', '#include "util/error.h"', '}', '#include "backend/cuda/cu_mma.h"', '#include "backend/cuda/cu_mma_gemm.h"',
       '#include "backend/cuda/cu_mma_stream.h"', '#include "model/expert_place.h"', '#include "model/e2m1_f16.h"', '#include "dsv4.h"',
       'static inline int cu_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }',
       'static unsigned char shim_dyn_smem[256 * 1024] __attribute__((aligned(16)));',
       'enum { cudaSuccess = 0, cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };',
       'template <typename F> static int cudaFuncSetAttribute(F, int, int) { return cudaSuccess; }',
       'static inline int cudaGetLastError(void) { return cudaSuccess; }',
       'static inline int cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }',
       'static inline void __trap(void) { fprintf(stderr, "shim: __trap\\n"); abort(); }']
a = common.index("/* ---- number formats"); b = common.index("/* ---- weights")
out.append(common[a:b])
a = quant.index("/* The scale of one block"); b = quant.rindex("#endif")
out.append(quant[a:b])
out.append(r'''
/* E4M3 from the format's definition: sign, 4 exponent bits (bias 7), 3 mantissa bits, exponent 0 subnormal
 * m 2^-9, S.1111.111 NaN. */
static double shim_e4m3_value(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 15 && m == 7 ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return b & 0x80 ? -v : v;
}
/* mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32, D = A B + C (PTX ISA, "Matrix Fragments for mma.m16n8k32"):
 * lane = 4 g + q, byte i of a register = element i; A[g][4q + i] in a0, A[g + 8][4q + i] in a1, A[g][16 + 4q + i]
 * in a2, A[g + 8][16 + 4q + i] in a3; B[4q + i][g] in b0, B[16 + 4q + i][g] in b1; D[g][2q + e] in d_e,
 * D[g + 8][2q + e] in d_(2 + e). Each element: its C plus its 32 products, summed in double (exact: products of
 * E4M3 values span fewer than 50 bits) and rounded once. Every lane of the warp calls it. */
static void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    uint64_t lo[32], hi[32], bv[32], cv0[32], cv1[32];
    memcpy(lo, shim_warp_exchange(a0 | (uint64_t)a1 << 32), sizeof lo);
    memcpy(hi, shim_warp_exchange(a2 | (uint64_t)a3 << 32), sizeof hi);
    memcpy(bv, shim_warp_exchange(b0 | (uint64_t)b1 << 32), sizeof bv);
    memcpy(cv0, shim_warp_exchange(__float_as_uint(d[0]) | (uint64_t)__float_as_uint(d[1]) << 32), sizeof cv0);
    memcpy(cv1, shim_warp_exchange(__float_as_uint(d[2]) | (uint64_t)__float_as_uint(d[3]) << 32), sizeof cv1);
    uint8_t A[16][32], B[32][8];
    float C[16][8];
    for (int L = 0; L < 32; L++) {
        const int g = L >> 2, q = L & 3;
        for (int i = 0; i < 4; i++) {
            A[g][4 * q + i] = (uint8_t)(lo[L] >> (8 * i));
            A[g + 8][4 * q + i] = (uint8_t)(lo[L] >> (32 + 8 * i));
            A[g][16 + 4 * q + i] = (uint8_t)(hi[L] >> (8 * i));
            A[g + 8][16 + 4 * q + i] = (uint8_t)(hi[L] >> (32 + 8 * i));
            B[4 * q + i][g] = (uint8_t)(bv[L] >> (8 * i));
            B[16 + 4 * q + i][g] = (uint8_t)(bv[L] >> (32 + 8 * i));
        }
        for (int e = 0; e < 2; e++) {
            C[g][2 * q + e] = __uint_as_float((uint32_t)(cv0[L] >> (32 * e)));
            C[g + 8][2 * q + e] = __uint_as_float((uint32_t)(cv1[L] >> (32 * e)));
        }
    }
    const int g = (int)shim_lane() >> 2, q = (int)shim_lane() & 3;
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e >> 1), col = 2 * q + (e & 1);
        double s = C[row][col];
        for (int k = 0; k < 32; k++) s += shim_e4m3_value(A[row][k]) * shim_e4m3_value(B[k][col]);
        d[e] = (float)s;
    }
}
/* prmt.b32, generic form: byte k of the result is byte (c >> 4k) & 7 of {b, a} (a = bytes 0..3), or that byte's
 * sign bit replicated when bit 3 of the selector nibble is set. */
static inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
    const uint64_t ab = a | (uint64_t)b << 32;
    uint32_t d = 0;
    for (int k = 0; k < 4; k++) {
        const unsigned sel = (c >> (4 * k)) & 15;
        uint32_t byte = (uint32_t)(ab >> (8 * (sel & 7))) & 0xff;
        if (sel & 8) byte = byte & 0x80 ? 0xff : 0;
        d |= byte << (8 * k);
    }
    return d;
}
static inline void cp_async16(void *dst, const void *src, int bytes) {
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) { fprintf(stderr, "shim: cp_async16 %p <- %p: not 16-byte aligned\n", dst, src); abort(); }
    if (bytes) memcpy(dst, src, 16); else memset(dst, 0, 16);
}
static inline void cp_async_commit(void) {}
template <int n> static inline void cp_async_wait(void) {}
static inline uint4 ld_stream16(const uint8_t *p) { return *(const uint4 *)p; }
''')

def kernels(text, poison):
    text = strip_asm(text)
    text = re.sub(r"^#include.*$", "", text, flags=re.M)
    # the dynamic shared memory, poisoned by thread 0 before any thread of the block can have written it (the
    # declaration comes before the kernel's first barrier: thread 0 runs first in the first round)
    text = re.sub(r"extern __shared__ [^;]*?(\w+)\[\];",
                  r"uint8_t *\1 = shim_dyn_smem; if (threadIdx.x == 0) shim_poison(shim_dyn_smem, sizeof shim_dyn_smem);", text)
    if poison:
        text = poison_shared(text)
    n0 = text.count("<<<")
    text, n = launches(text, r"k_mma_\w+(?:<[^<>;]*>)?")
    assert n == n0 and "<<<" not in text, (n, n0)
    return text

a = mma.index("#define MMA_PARTS"); b = mma.index("/* dev_f32_to_e4m3 (the build's) against")
body = mma[a:b]
a = mma.index('extern "C" int cu_mma_pack_act')
body += mma[a:]
if "uint32_t e2m1x4_e4m3(" not in body:   # k_mma.cu without its own copy: the header's
    a = frag.index("/* ---- end of PTX"); b = frag.rindex("#endif")
    out.append(frag[a:b])
# k_mma.cu's static reduction array is declared after its chunk loop, which its four warps leave at different
# times (partials of unequal length): poisoning it there would hit what the earlier warps already wrote
out.append(kernels(body, False))
out.append('extern "C" int cu_mma_e4m3_check(unsigned long long *m, unsigned int *f, dsv4_error *err) { (void)m; (void)f; '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cu_mma_e4m3_check: GPU only"); }')
# the streaming kernel (k_mma_stream.cu, its own shim: shim_stream.sh) declines every call
out.append('extern "C" int cu_mma_stream_linear(cu_stream, const dsv4_weight *, float *, int, const dsv4_weight *, float *, int, '
           'const uint8_t *, int, const float *, int, int, int) { return 0; }')
out.append('extern "C" int cu_mma_stream_experts(cu_stream, const dsv4_weight *, float *, const dsv4_weight *, float *, int, int, int, '
           'const cu_moe_plan *, int, const uint8_t *, int, const float *, int, int, int, int) { return 0; }')
a = gemm.index("#define GEMM_BM")
out.append(kernels(gemm[a:], True))
open(sys.argv[1], "w").write("\n".join(out))
PY
BUG=
[ -n "${GEMM_BUG:-}" ] && BUG=-DDSV4_GEMM_BUG=$GEMM_BUG
g++ -O2 -std=c++17 -w $BUG ${SHIM_FLAGS:-} -Iinclude -Isrc -Itools/gpu/shim -c "$D/gemm_kernels.cpp" -o "$D/gemm_kernels.o"
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
cc -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -DGEMM_TEST_SHIM -Iinclude -Isrc -Itests/gpu \
    -c tests/gpu/test_gpu_gemm.c -o "$D/test.o"
g++ -o "$D/test_gpu_gemm_shim" "$D/test.o" "$D/gemm_kernels.o" "$D/cuda_shim.o" build/libdsv4.a \
    -lcmocka -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
"$D/test_gpu_gemm_shim"
