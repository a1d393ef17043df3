#!/usr/bin/env bash
# Runs tests/gpu/test_gpu_stream.c on the CPU against the very source of the FP8/FP4 tensor-core linears: the
# streaming kernel (k_mma_stream.cu) and the small-tile kernels it must match bit for bit (k_mma.cu), through
# tools/gpu/shim/cuda_shim.h, every GPU thread a fiber. The inline assembly is replaced by C++ of the same
# definitions: mma.m16n8k32 .e4m3 from the PTX ISA's fragment layout and prmt by its definition (shim_frag.h,
# written from the ISA, not from the kernels), and cp.async as the hardware's contract asks of the code: the destination is poisoned
# when the copy is issued and the bytes land only when the issuing thread's cp.async.wait_group lets that group
# complete, so a read of a stage before its wait and barrier, or a refill of a stage some warp still reads, shows
# as wrong bits. Both kernels include cu_mma_frag.cuh (mma_e4m3, prmt, e2m1x4_e4m3; the script checks it). The device has SHIM_SMS multiprocessors (default
# 2) and room for 2 blocks on each, so the persistent grid is small and each block walks many items. Checks the
# stage layout, the item walk, the fragment reads, the scales and the partials' order; the instructions themselves
# and the timing only on the GPU (the same test there). Needs `make` (build/libdsv4.a). STREAM_BUG=1 / 2 build with
# -DDSV4_STREAM_BUG=1 / 2 / 3 (must fail). SHIM_TEST=mma runs tests/gpu/test_gpu_mma.c on the same kernels instead
# (its exact, bound and invariance tests at stream 1 and 0; slow). Not part of `make test` nor of the GPU suite.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim-stream}
mkdir -p "$D"
python3 - "$D/stream_kernels.cpp" <<'PY'
import re, sys
sys.path.insert(0, "tools/gpu/shim")
from shim_src import poison_shared, launches, strip_asm

common = open("src/backend/cuda/cu_common.cuh").read()
quant = open("src/backend/cuda/cu_quant.cuh").read()
frag = open("src/backend/cuda/cu_mma_frag.cuh").read()
mma = open("src/backend/cuda/k_mma.cu").read()
stream = open("src/backend/cuda/k_mma_stream.cu").read()
assert '#include "backend/cuda/cu_mma_frag.cuh"' in mma and '#include "backend/cuda/cu_mma_frag.cuh"' in stream, \
    "both kernels take mma_e4m3, prmt and e2m1x4_e4m3 from cu_mma_frag.cuh"
out = ['#include "cuda_shim.h"', '#include "shim_frag.h"', '#include <algorithm>', '#include <climits>', '#include <vector>', 'using std::min;',
       'extern "C" {', '#include "util/error.h"', '}', '#include "backend/cuda/cu_mma.h"', '#include "backend/cuda/cu_mma_gemm.h"',
       '#include "backend/cuda/cu_mma_stream.h"', '#include "model/expert_place.h"', '#include "model/e2m1_f16.h"', '#include "dsv4.h"',
       'static inline int cu_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }',
       'static unsigned char shim_dyn_smem[256 * 1024] __attribute__((aligned(16)));',
       # cuda_shim.h has the opt-in calls; the streaming launcher's device query is renamed (below) to this one
       'static inline cudaError_t shim_stream_sms(int *v, cudaDeviceAttr, int) { const char *e = getenv("SHIM_SMS"); *v = e ? atoi(e) : 2; return cudaSuccess; }',
       'template <typename F> static cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int, size_t) { *n = 2; return cudaSuccess; }']
a = common.index("/* ---- number formats"); b = common.index("/* ---- weights")
out.append(common[a:b])
a = quant.index("/* The scale of one block"); b = quant.rindex("#endif")
out.append(quant[a:b])
out.append(r'''
/* cp.async: per thread, the copies issued and the group boundaries committed; the destination poisoned at issue,
 * the bytes copied when a wait_group completes the group (the source is read then: the kernels' sources do not
 * change during a launch). */
struct shim_copy { void *dst; const void *src; int n; };
static std::vector<shim_copy> shim_cp_pending[1024];
static std::vector<size_t> shim_cp_groups[1024];
static long shim_cp_count;
static inline void shim_cp_issue(void *dst, const void *src, int n) {
    if ((uintptr_t)dst % n || (uintptr_t)src % n) { fprintf(stderr, "shim: cp.async of %d bytes %p <- %p: misaligned\n", n, dst, src); abort(); }
    if ((uint8_t *)dst < shim_dyn_smem || (uint8_t *)dst + n > shim_dyn_smem + sizeof shim_dyn_smem) {
        fprintf(stderr, "shim: cp.async into %p: not the dynamic shared memory\n", dst); abort();
    }
    memset(dst, 0xA5, n);
    shim_cp_pending[threadIdx.x].push_back(shim_copy{ dst, src, n });
    shim_cp_count++;
}
static inline void st_cp16(void *dst, const void *src) { shim_cp_issue(dst, src, 16); }
static inline void st_cp4(void *dst, const void *src) { shim_cp_issue(dst, src, 4); }
static inline void st_commit(void) { shim_cp_groups[threadIdx.x].push_back(shim_cp_pending[threadIdx.x].size()); }
template <int n> static inline void st_wait(void) {
    std::vector<size_t> &g = shim_cp_groups[threadIdx.x];
    std::vector<shim_copy> &p = shim_cp_pending[threadIdx.x];
    if ((int)g.size() <= n) return;
    const size_t upto = g[g.size() - n - 1];   /* the copies of every group but the newest n */
    for (size_t i = 0; i < upto; i++) memcpy(p[i].dst, p[i].src, p[i].n);
    p.erase(p.begin(), p.begin() + upto);
    g.erase(g.begin(), g.end() - n);
    for (size_t &b : g) b -= upto;
}
''')

def kernels(text, poison):
    text = strip_asm(text)
    text = re.sub(r"^#include.*$", "", text, flags=re.M)
    text = re.sub(r"extern __shared__ [^;]*?(\w+)\[\];",
                  r"uint8_t *\1 = shim_dyn_smem; shim_poison_block(shim_dyn_smem, sizeof shim_dyn_smem);", text)
    if poison:
        text = poison_shared(text)
    n0 = text.count("<<<")
    text, n = launches(text, r"k_mma_\w+(?:<[^<>;]*>)?")
    assert n == n0 and "<<<" not in text, (n, n0)
    return text

a = frag.index("/* ---- end of PTX"); b = frag.rindex("#endif")
out.append(frag[a:b])   # e2m1x4_e4m3, which both kernels include
a = mma.index("#define MMA_PARTS"); b = mma.index("/* dev_f32_to_e4m3 (the build's) against")
body = mma[a:b]
a = mma.index('extern "C" int cu_mma_pack_act')
body += mma[a:]
# k_mma.cu's kernels declare their reduction arrays at the top: poisoned there by thread 0 before any warp writes
out.append(kernels(body, True))
out.append('extern "C" int cu_mma_e4m3_check(unsigned long long *m, unsigned int *f, dsv4_error *err) { (void)m; (void)f; '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cu_mma_e4m3_check: GPU only"); }')
# the large-T GEMM (its own shim: shim_gemm.sh) off: every call here is at most 16 tokens a tile
out.append('extern "C" int cu_mma_gemm_linear(cu_stream, const dsv4_weight *, const uint8_t *, int, const float *, int, int, float *, int, int) '
           '{ return 0; }')
out.append('extern "C" int cu_nat_experts(cu_stream, int, const dsv4_weight *, const dsv4_weight *, int, int, const cu_moe_plan *, int, '
           'const uint8_t *, int, const float *, int, int, float *, float *, int, int, dsv4_error *err) { '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "native FP8 experts: GPU only (k_expert_nat.cu has no shim)"); }')
out.append('extern "C" int cu_mma_gemm_experts(cu_stream, const dsv4_weight *, int, int, int, const cu_moe_plan *, int, const uint8_t *, int, '
           'const float *, int, int, float *, int, int) { return 0; }')
out.append('extern "C" int cu_mma_gemm_min_t(void) { return 0; }')
out.append('extern "C" int cu_mma_gemm_takes_linear(const dsv4_weight *, int) { return 0; }')
a = stream.index("#define ST_WARPS")
st = stream[a:]
a = st.index("/* ---- PTX"); b = st.index("/* ---- end of PTX")
st = st[:a] + st[b:]
st = st.replace("cudaDeviceGetAttribute(", "shim_stream_sms(")   # SHIM_SMS multiprocessors, not cuda_shim.h's 132
out.append(kernels(st, True))
out.append('extern "C" long shim_stream_copies(void) { return shim_cp_count; }')
open(sys.argv[1], "w").write("\n".join(out))
PY
BUG=
[ -n "${STREAM_BUG:-}" ] && BUG=-DDSV4_STREAM_BUG=$STREAM_BUG
g++ -O2 -std=c++17 -w $BUG ${SHIM_FLAGS:-} -DMMA_SHIM -Iinclude -Isrc -Itools/gpu/shim -c "$D/stream_kernels.cpp" -o "$D/stream_kernels.o"
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
TEST=${SHIM_TEST:-stream}   # SHIM_TEST=mma: tests/gpu/test_gpu_mma.c instead (its every test at stream 1 and 0)
cc -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -DMMA_TEST_SHIM -Iinclude -Isrc -Itests/gpu \
    -c tests/gpu/test_gpu_$TEST.c -o "$D/test_$TEST.o"
g++ -o "$D/test_gpu_${TEST}_shim" "$D/test_$TEST.o" "$D/stream_kernels.o" "$D/cuda_shim.o" build/libdsv4.a \
    -lcmocka -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
"$D/test_gpu_${TEST}_shim"
