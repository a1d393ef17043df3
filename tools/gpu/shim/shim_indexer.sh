#!/usr/bin/env bash
# Runs tests/gpu/test_gpu_indexer.c on the CPU against the very source of the lightning indexer's kernels
# (src/backend/cuda/k_indexer.cu, launchers included) through tools/gpu/shim/cuda_shim.h: a check of their indexing,
# barriers, warp intrinsics and launch arithmetic on a machine without a GPU, with the test's smaller sizes
# (-DIDX_TEST_SHIM). The selection is also compared with the kernel it replaced (k_index_topk at commit b39512f,
# taken from git). SHIM_FLAGS: extra compiler flags for the kernels (e.g. -DIDX_SEL_MATCH=0). Needs `make` (build/libdsv4.a). Not part of `make test` (nor of the GPU suite: it lives outside tests/).
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim-indexer}
mkdir -p "$D"
git show b39512f:src/backend/cuda/k_indexer.cu > "$D/old_indexer.cu"
python3 - "$D/idx_kernels.cpp" "$D/old_indexer.cu" <<'PY'
import re, sys
sys.path.insert(0, "tools/gpu/shim")
from shim_src import poison_shared, launches
src = open("src/backend/cuda/k_indexer.cu").read()
old = open(sys.argv[2]).read()
common = open("src/backend/cuda/cu_common.cuh").read()
kvrow = open("src/backend/cuda/cu_kvrow.cuh").read()
out = ['#include "cuda_shim.h"', '#include "shim_mma.h"', '#include "backend/cuda/cu_kernels.h"', '#include "dsv4.h"',
       '#define KV_F32 DSV4_KV_F32', '#define KV_BF16 DSV4_KV_BF16', '#define ROW_INDEX 1', '#define CUDA_SHIM 1',
       'static float shim_dyn_smem[1 << 18];']
a = common.index("/* ---- number formats"); b = common.index("/* ---- reductions")
out.append(common[a:b])
a = kvrow.index("/* ---- stored rows")
out.append(kvrow[a:])
def kernels(text):
    text = re.sub(r"^#include.*$", "", text, flags=re.M)
    text = re.sub(r"extern __shared__ [^;]*?(\w+)\[\];", r"float *\1 = shim_dyn_smem;", text)
    text = poison_shared(text)
    text, _ = launches(text, r"\w+(?:<\w+>)?")
    assert "<<<" not in text
    return text
out.append(kernels(src))
# the replaced selection kernel, renamed
a = old.index("/* A total order on (score, row)"); b = old.index('extern "C" int cu_index_select')
o = old[a:b].replace("k_index_topk", "old_k_index_topk")
out.append(kernels(o))
out.append('''extern "C" void shim_old_index_topk(const int64_t *pos, int t0, int T, int K, int64_t max_rows, const float *scratch,
                                    int32_t *sel, int32_t *n_sel) {
    shim_launch(dim3(T), dim3(IDX_SEL_THREADS), [&] { old_k_index_topk(pos, t0, K, max_rows, scratch, sel, n_sel); });
}''')
open(sys.argv[1], "w").write("\n".join(out))
PY
g++ -O2 -std=c++17 -w ${SHIM_FLAGS:-} -Iinclude -Isrc -Itools/gpu/shim -c "$D/idx_kernels.cpp" -o "$D/idx_kernels.o"
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
cc -O2 -std=gnu11 -Wall -DIDX_TEST_SHIM -Iinclude -Isrc -Itests/gpu -c tests/gpu/test_gpu_indexer.c -o "$D/test.o"
g++ -o "$D/test_gpu_indexer_shim" "$D/test.o" "$D/idx_kernels.o" "$D/cuda_shim.o" build/libdsv4.a \
    -lcmocka -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
"$D/test_gpu_indexer_shim"
