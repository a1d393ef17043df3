#!/usr/bin/env bash
# Runs tests/gpu/test_gpu_mma.c on the CPU against the very source of the FP8/FP4 tensor-core linears (k_mma.cu: its
# kernels and launchers, the plain and the expert one) through tools/gpu/shim/cuda_shim.h: the fragment layouts of
# mma.m16n8k32 .e4m3 as the PTX ISA defines them and prmt by its definition (shim_frag.h), every GPU
# thread a fiber. Checks the kernels' loads, k maps, tiles, the FP4 vector loads' quad transposes against the
# word-wise loads (memcmp), the expert tiles against the plain linear (memcmp), and the partial-sum order without a
# GPU; the PTX section is replaced by C++ of the same definitions, so the instructions themselves are checked only
# on the GPU. The all-floats E4M3 check and the benchmarks are GPU-only. Needs `make` (build/libdsv4.a). ~1-3 min.
# MMA_BUG=1 builds with -DDSV4_MMA_BUG (must fail); SHIM_FLAGS adds kernel flags (e.g. -DMMA_FP4_VEC=0).
# Not part of `make test` nor of the GPU suite.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim-mma}
mkdir -p "$D"
python3 - "$D/mma_kernels.cpp" <<'PY'
import re, sys
sys.path.insert(0, "tools/gpu/shim")
from shim_src import poison_shared, launches
src = open("src/backend/cuda/k_mma.cu").read()
common = open("src/backend/cuda/cu_common.cuh").read()
quant = open("src/backend/cuda/cu_quant.cuh").read()
out = ['#include "cuda_shim.h"', '#include "shim_frag.h"', '#include <algorithm>', '#include <climits>', 'using std::min;',
       'extern "C" {', '#include "util/error.h"', '}', '#include "backend/cuda/cu_mma.h"', '#include "backend/cuda/cu_mma_gemm.h"', '#include "backend/cuda/cu_mma_stream.h"', '#include "model/expert_place.h"',
       '#include "model/e2m1_f16.h"', '#include "dsv4.h"', 'extern "C" {', '#include "backend/cuda/cu_kernels.h"', '}',
       'static inline int cu_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }']
a = common.index("/* ---- number formats"); b = common.index("/* ---- weights")
out.append(common[a:b])
a = quant.index("/* The scale of one block"); b = quant.rindex("#endif")
out.append(quant[a:b])
hcpost = open("src/backend/cuda/cu_hc_post.cuh").read()
a = hcpost.index("/* hc_post of one element"); b = hcpost.rindex("#endif")
out.append(hcpost[a:b])   # hc_post_elem4, the epilogue of cu_mma_linear_post
a = src.index("#define MMA_PARTS"); b = src.index("/* ---- PTX")
out.append(src[a:b])   # the split and the bug switch
frag = open("src/backend/cuda/cu_mma_frag.cuh").read()
a = frag.index("/* ---- end of PTX"); b = frag.rindex("#endif")
out.append(frag[a:b])   # e2m1x4_e4m3 (k_mma.cu includes the header; its PTX is shim_frag.h's C++)
a = src.index("/* ---- end of PTX"); b = src.index("/* dev_f32_to_e4m3 (the build's) against")
body = src[a:b]
a = src.index('extern "C" int cu_mma_pack_act')
body += src[a:]
# the kernels declare their reduction arrays at the top (thread 0 poisons them before any warp writes)
body = poison_shared(body)
n0 = body.count("<<<")
body, _ = launches(body, r"k_mma_\w+(?:<[^<>;]*>)?")
assert n0 == 11 and "<<<" not in body, n0
out.append(body)
# the large-T GEMM (k_mma_gemm.cu, its own shim: shim_gemm.sh) switched off: every call takes k_mma.cu's kernels
out.append('extern "C" int cu_mma_gemm_linear(cu_stream, const dsv4_weight *, const uint8_t *, int, const float *, int, int, float *, int, int) '
           '{ return 0; }')
out.append('extern "C" int cu_mma_gemm_experts(cu_stream, const dsv4_weight *, int, int, int, const cu_moe_plan *, int, const uint8_t *, int, '
           'const float *, int, int, float *, int, int) { return 0; }')
out.append('extern "C" int cu_mma_gemm_min_t(void) { return 0; }')
out.append('extern "C" int cu_mma_gemm_takes_linear(const dsv4_weight *, int) { return 0; }')
# the streaming kernel (k_mma_stream.cu, its own shim: shim_stream.sh) declines every call: k_mma.cu's kernels at
# either value of the `stream` argument
out.append('extern "C" int cu_mma_stream_linear(cu_stream, const dsv4_weight *, float *, int, const dsv4_weight *, float *, int, '
           'const uint8_t *, int, const float *, int, int, int) { return 0; }')
out.append('extern "C" int cu_mma_stream_experts(cu_stream, const dsv4_weight *, float *, const dsv4_weight *, float *, int, int, int, '
           'const cu_moe_plan *, int, const uint8_t *, int, const float *, int, int, int, int) { return 0; }')
out.append('extern "C" int cu_mma_e4m3_check(unsigned long long *m, unsigned int *f, dsv4_error *err) { (void)m; (void)f; '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cu_mma_e4m3_check: GPU only"); }')
out.append('extern "C" int cu_nat_experts(cu_stream, int, const dsv4_weight *, const dsv4_weight *, int, int, const cu_moe_plan *, int, '
           'const uint8_t *, int, const float *, int, int, float *, float *, int, int, dsv4_error *err) { '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "native FP8 experts: GPU only (k_expert_nat.cu has no shim)"); }')
out.append('extern "C" int cu_mma_emu_check(unsigned long long *m, unsigned long long *c, dsv4_error *err) { (void)m; (void)c; '
           'return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cu_mma_emu_check: GPU only"); }')
open(sys.argv[1], "w").write("\n".join(out))
PY
BUG=
[ "${MMA_BUG:-0}" = 1 ] && BUG=-DDSV4_MMA_BUG
g++ -O2 -std=c++17 -w $BUG ${SHIM_FLAGS:-} -DMMA_SHIM -Iinclude -Isrc -Itools/gpu/shim -c "$D/mma_kernels.cpp" -o "$D/mma_kernels.o"
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
cc -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -DMMA_TEST_SHIM -Iinclude -Isrc -Itests/gpu \
    -c tests/gpu/test_gpu_mma.c -o "$D/test.o"
g++ -o "$D/test_gpu_mma_shim" "$D/test.o" "$D/mma_kernels.o" "$D/cuda_shim.o" build/libdsv4.a \
    -lcmocka -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
"$D/test_gpu_mma_shim"
