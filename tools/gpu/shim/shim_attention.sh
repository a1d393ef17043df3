#!/usr/bin/env bash
# Runs tests/gpu/test_gpu_attention.c on the CPU against the very source of the chunked attention kernels
# (k_attention.cu's ATT_CHUNKED section, its launcher included), through tools/gpu/shim/cuda_shim.h: a check of their
# indexing, barriers and launch arithmetic on a machine without a GPU. Needs `make` (build/libdsv4.a). Slow (every
# GPU thread is a fiber): SHIM_QUICK=1 (the default) runs the small cases only (~1 min), SHIM_QUICK=0 the test's
# own sizes (~4 min). k_att_dec (one launch with grid barriers) runs as its three steps in turn (ATT_SPLIT_PHASES:
# the shim's blocks run one after another, so a grid barrier could never be met). The OFFICIAL cases run both paths: CUDA cores and bf16 tensor cores (the mma.sync through
# cuda_shim.cpp's emulation from the PTX fragment layout). SHIM_CFLAGS: extra defines for the kernels (e.g.
# -DATT_MMA_BUG=1 or =2, which must fail). SHIM_SRC: the directory whose backend/cuda/ sources are taken (default src;
# shim_attention_ab.sh points it at an older commit's). Not part of `make test` (nor of the GPU suite: it lives outside
# tests/).
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim}
mkdir -p "$D"
python3 - "$D/att_kernels.cpp" "${SHIM_SRC:-src}/backend/cuda" <<'PY'
import re, sys
sys.path.insert(0, "tools/gpu/shim")
from shim_src import poison_shared, launches
cu = sys.argv[2]
src = open(cu + "/k_attention.cu").read()
common = open(cu + "/cu_common.cuh").read()
kvrow = open(cu + "/cu_kvrow.cuh").read()
rope = open(cu + "/cu_rope.cuh").read()
out = ['#include "cuda_shim.h"', '#include "backend/cuda/cu_kernels.h"', '#include "dsv4.h"',
       '#define KV_F32 DSV4_KV_F32', '#define KV_BF16 DSV4_KV_BF16', '#define ROW_INDEX 1',
       'alignas(16) static float shim_dyn_smem[1 << 18];']
a = common.index("/* ---- number formats"); b = common.index("/* ---- reductions")
out.append(common[a:b])
a = rope.index("__device__ __forceinline__ void rope_pair"); b = rope.rindex("#endif")
out.append(rope[a:b])
a = kvrow.index("/* ---- stored rows")
out.append(kvrow[a:])   # kv_bits, kv_value, kv_elem and fma_tile4x4
# the measuring build's switches (ATT_BLOCK_TIMES off: its macros are empty)
a = src.index("/* -DATT_BLOCK_TIMES=1"); b = src.index("__device__ __forceinline__ void put_bf16_bytes")
out.append(src[a:b])
a = src.index("#if ATT_CHUNKED\n"); b = src.rindex("#endif", a, src.index("\n#if !ATT_CHUNKED", src.index('extern "C" int cu_attention(cu_stream st', a)))
chunk = src[a + len("#if ATT_CHUNKED\n"):b]
chunk = chunk.replace("extern __shared__ float out_s[];", "float *out_s = shim_dyn_smem;")
chunk = chunk.replace("extern __shared__ __align__(16) unsigned char att_dec_smem_base[];",
                      "unsigned char *att_dec_smem_base = (unsigned char *)shim_dyn_smem;\n"
                      "    if (threadIdx.x == 0) shim_poison(shim_dyn_smem, sizeof(float) << 16);")
# poison every static shared array before each block (thread 0 reaches its declarations first)
chunk = poison_shared(chunk)
n0 = chunk.count("<<<")
chunk, _ = launches(chunk)
assert n0 == 5 + ('k_att_scores_dec' in chunk) + ('k_att_dec(' in chunk) + ('scores_big(' in chunk) + ('k_att_dec_mma(' in chunk) and "<<<" not in chunk, n0
out.append(chunk)
open(sys.argv[1], "w").write("\n".join(out))
PY
g++ -O2 -std=c++17 -w -DATT_MMA_EMULATED -DATT_SPLIT_PHASES ${SHIM_CFLAGS:-} -Iinclude -Isrc -Itools/gpu/shim -c "$D/att_kernels.cpp" -o "$D/att_kernels.o"
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
QUICK=
[ "${SHIM_QUICK:-1}" = 1 ] && QUICK=-DATT_TEST_QUICK
cc -O2 -std=gnu11 -DATT_TEST_EMULATE -DATT_TEST_SHIM $QUICK -Iinclude -Isrc -Itests/gpu \
    -c tests/gpu/test_gpu_attention.c -o "$D/test.o"
g++ -o "$D/test_gpu_attention_shim" "$D/test.o" "$D/att_kernels.o" "$D/cuda_shim.o" build/libdsv4.a \
    -lcmocka -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
"$D/test_gpu_attention_shim"
