#!/usr/bin/env bash
# Runs tests/gpu/test_gpu_gemm.c on the CPU against the very source of the FP8/FP4 tensor-core linears: the large-T
# GEMM (k_mma_gemm.cu) and the small-tile kernels it must match bit for bit (k_mma.cu), through
# tools/gpu/shim/cuda_shim.h, every GPU thread a fiber. The inline assembly is replaced by C++ of the same
# definitions: mma.m16n8k32 .e4m3 from the PTX ISA's fragment layout as sm_90 computes it (two fp16 MMAs and an
# addition: SHIM_E4M3_WRITTEN), wgmma m64n128k16 / m64n64k16 .f16 (the warpgroup path) from its layouts with the same sums, prmt
# and cvt.f16x2.e4m3x2 by their definitions (shim_frag.h, written from the ISA, not from the kernels), cp.async as a
# plain copy (or zero fill) done at once, its groups' waits and wgmma's fences, commits and waits as no-ops. Checks the stage layout, the fragment loads, the chunk walk and the fold order of the GEMM against the
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
from shim_src import poison_shared, launches, strip_asm

common = open("src/backend/cuda/cu_common.cuh").read()
quant = open("src/backend/cuda/cu_quant.cuh").read()
frag = open("src/backend/cuda/cu_mma_frag.cuh").read()
mma = open("src/backend/cuda/k_mma.cu").read()
gemm = open("src/backend/cuda/k_mma_gemm.cu").read()
out = ['#include "cuda_shim.h"', '#include "shim_frag.h"', '#include <algorithm>', '#include <climits>', 'using std::min;',
       'extern "C" {', '#include "util/error.h"', '}', '#include "backend/cuda/cu_mma.h"', '#include "backend/cuda/cu_mma_gemm.h"',
       '#include "backend/cuda/cu_mma_stream.h"', '#include "model/expert_place.h"', '#include "model/e2m1_f16.h"', '#include "dsv4.h"',
       'extern "C" {', '#include "backend/cuda/cu_kernels.h"', '}',
       'static inline int cu_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }',
       'static unsigned char shim_dyn_smem[256 * 1024] __attribute__((aligned(16)));']
a = common.index("/* ---- number formats"); b = common.index("/* ---- weights")
out.append(common[a:b])
a = quant.index("/* The scale of one block"); b = quant.rindex("#endif")
out.append(quant[a:b])
hcpost = open("src/backend/cuda/cu_hc_post.cuh").read()
a = hcpost.index("/* hc_post of one element"); b = hcpost.rindex("#endif")
out.append(hcpost[a:b])   # hc_post_elem4: k_mma.cu's fused wo_b epilogue (cu_mma_linear_post)
out.append(r'''
static inline void cp_async16(void *dst, const void *src, int bytes) {
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) { fprintf(stderr, "shim: cp_async16 %p <- %p: not 16-byte aligned\n", dst, src); abort(); }
    if (bytes) memcpy(dst, src, 16); else memset(dst, 0, 16);
}
static inline void cp_async_commit(void) {}
template <int n> static inline void cp_async_wait(void) {}
''')

def kernels(text, poison):
    text = strip_asm(text)
    text = re.sub(r"^#include.*$", "", text, flags=re.M)
    # the dynamic shared memory, poisoned once a block by thread 0 before any thread can have written it
    # (shim_poison_block: gemm_block declares it once a tile, and a block of experts runs several tiles)
    text = re.sub(r"extern __shared__ [^;]*?(\w+)\[\];",
                  r"uint8_t *\1 = shim_dyn_smem; shim_poison_block(shim_dyn_smem, sizeof shim_dyn_smem);", text)
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
a = frag.index("/* ---- end of PTX"); b = frag.rindex("#endif")
out.append(frag[a:b])   # e2m1x4_e4m3 (both kernels include cu_mma_frag.cuh; its PTX is shim_frag.h's C++)
# k_mma.cu's kernels declare their reduction arrays at the top: poisoned there by thread 0 before any warp writes
out.append(kernels(body, True))
out.append('extern "C" int cu_mma_e4m3_check(unsigned long long *m, unsigned int *f, dsv4_error *err) { (void)m; (void)f; '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cu_mma_e4m3_check: GPU only"); }')
out.append('extern "C" int cu_nat_experts(cu_stream, int, const dsv4_weight *, const dsv4_weight *, int, int, const cu_moe_plan *, int, '
           'const uint8_t *, int, const float *, int, int, float *, float *, int, int, dsv4_error *err) { '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "native FP8 experts: GPU only (k_expert_nat.cu has no shim)"); }')
out.append('extern "C" int cu_mma_emu_check(unsigned long long *m, unsigned long long *c, dsv4_error *err) { (void)m; (void)c; '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cu_mma_emu_check: GPU only"); }')
# the streaming kernel (k_mma_stream.cu, its own shim: shim_stream.sh) declines every call
out.append('extern "C" int cu_mma_stream_linear(cu_stream, const dsv4_weight *, float *, int, const dsv4_weight *, float *, int, '
           'const uint8_t *, int, const float *, int, int, int) { return 0; }')
out.append('extern "C" int cu_mma_stream_experts(cu_stream, const dsv4_weight *, float *, const dsv4_weight *, float *, int, int, int, '
           'const cu_moe_plan *, int, const uint8_t *, int, const float *, int, int, int, int) { return 0; }')
plan = open("src/backend/cuda/cu_plan_groups.cuh").read()
a = plan.index("/* Tiles a and a + 1"); b = plan.rindex("#endif")
out.append(plan[a:b])   # plan_block_groups: the expert GEMM's walk of the plan
a = gemm.index("#define GEMM_BM")
wg = r'''
/* The warpgroup path's PTX (k_mma_gemm.cu), by the ISA's definitions. wgmma m64n128k16 .f16 with A from registers:
 * each warp of the warpgroup computes its own 16 rows (its lanes' A registers in mma.m16n8k16's layout) against the
 * 128 x 16 B read through the no-swizzle K-major descriptor layout (HG_LBO, HG_SBO), each element its C (acc) or 0
 * plus its 16 exact products in double, k in order, rounded once: hmma_f16's sums (shim_frag.h). Issued and
 * complete at once, so the fences, commits and waits are no-ops. */
static inline void wg_fence(void) {}
static inline void wg_commit(void) {}
static inline void wg_wait0(void) {}
static inline void wg_pin(float &) {}
static inline void wg_pin_r(uint32_t &) {}
static inline void fence_proxy_async(void) {}
template <int NA> static inline void shim_hgmma(float (&d)[NA], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const void *b, int acc) {
    double A[16][16];
    shim_a_f16(A, a0, a1, a2, a3);
    const uint64_t *bp = shim_warp_exchange((uint64_t)(uintptr_t)b);
    for (int L = 0; L < 32; L++)
        if (bp[L] != bp[0]) { fprintf(stderr, "shim: wgmma with different B descriptors in one warp\n"); abort(); }
    if ((uintptr_t)b % 16) { fprintf(stderr, "shim: wgmma B at %p: not 16-byte aligned\n", b); abort(); }
    const uint8_t *B = (const uint8_t *)b;
    const int g = (int)shim_lane() >> 2, q = (int)shim_lane() & 3;
    for (int i = 0; i < NA / 4; i++)
        for (int e = 0; e < 4; e++) {
            const int row = g + 8 * (e >> 1), n = 8 * i + 2 * q + (e & 1);
            double s = acc ? d[4 * i + e] : 0.0;
            for (int k = 0; k < 16; k++) {
                uint16_t h;
                memcpy(&h, B + (n >> 3) * HG_SBO + (k >> 3) * HG_LBO + (n & 7) * 16 + (k & 7) * 2, 2);
                s += A[row][k] * shim_f16(h);
            }
            d[4 * i + e] = (float)s;
        }
}
static inline void hgmma_n128(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const void *b, int acc) {
    shim_hgmma<64>(d, a0, a1, a2, a3, b, acc);
}
static inline void hgmma_n64(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const void *b, int acc) {
    shim_hgmma<32>(d, a0, a1, a2, a3, b, acc);
}
'''
text = kernels(gemm[a:], True)
anchor = "#define HG_BRAW_LD 144\n"
assert anchor in text
out.append(text.replace(anchor, anchor + wg, 1))
open(sys.argv[1], "w").write("\n".join(out))
PY
BUG=
[ -n "${GEMM_BUG:-}" ] && BUG=-DDSV4_GEMM_BUG=$GEMM_BUG
g++ -O2 -std=c++17 -w -DSHIM_E4M3_WRITTEN $BUG ${SHIM_FLAGS:-} -Iinclude -Isrc -Itools/gpu/shim -c "$D/gemm_kernels.cpp" -o "$D/gemm_kernels.o"
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
cc -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -DGEMM_TEST_SHIM -Iinclude -Isrc -Itests/gpu \
    -c tests/gpu/test_gpu_gemm.c -o "$D/test.o"
g++ -o "$D/test_gpu_gemm_shim" "$D/test.o" "$D/gemm_kernels.o" "$D/cuda_shim.o" build/libdsv4.a \
    -lcmocka -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
"$D/test_gpu_gemm_shim"
