#!/usr/bin/env bash
# Runs tools/gpu/shim/shim_mhc_test.cpp on the CPU against the very source of the mHC and routing kernels (k_layer.cu:
# norms to the end; k_moe.cu: routing and the plan), through tools/gpu/shim/cuda_shim.h, every GPU thread a fiber. The
# source is built twice: v0 with -DDSV4_MHC_FAST=0 -DDSV4_MOE_FAST=0 (the kernels before issue 18's rewrite) and v1
# with both on (the fast kernels where they apply); the test runs both on the same inputs, decode and prefill
# shapes, both numeric modes, and requires every output byte to be equal (and the plan to match a host reference).
# ~1-2 min. MHC_BUG=pre|rms|post|route|plan|planbig mutates v1's source (a changed order or an off-by-one) so that the test
# must fail. Not part of `make test` nor of the GPU suite; needs no build of the project.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim-mhc}
mkdir -p "$D"
pids=()
for v in 0 1; do
python3 - "$D/mhc_kernels_v$v.cpp" "$v" "${MHC_BUG:-}" <<'PY'
import sys
sys.path.insert(0, "tools/gpu/shim")
from shim_src import poison_shared, launches
out_path, v, bug = sys.argv[1], sys.argv[2], sys.argv[3]
common = open("src/backend/cuda/cu_common.cuh").read()
quant = open("src/backend/cuda/cu_quant.cuh").read()
layer = open("src/backend/cuda/k_layer.cu").read()
moe = open("src/backend/cuda/k_moe.cu").read()
out = ['#include "cuda_shim.h"', '#include <algorithm>', 'using std::min;', 'using std::max;',
       'extern "C" {', '#include "backend/cuda/cu_kernels.h"', '#include "core/sinkhorn.h"', '}',
       'namespace v%s {' % v,
       'static inline int cu_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }']
a = common.index("/* ---- number formats"); b = common.index("/* ---- weights")
out.append(common[a:b])
a = quant.index("/* The scale of one block"); b = quant.rindex("#endif")
out.append(quant[a:b])
a = layer.index("#define ROW_THREADS"); b = layer.index("/* ---- embedding")
top = layer[a:b]
hcpost = open("src/backend/cuda/cu_hc_post.cuh").read()
a = hcpost.index("/* hc_post of one element"); b = hcpost.rindex("#endif")
top += "\n" + hcpost[a:b]   # hc_post_elem, hc_post_elem4 (k_layer.cu includes the header)
a = layer.index("/* ---- norms")
b = layer.find("/* ---- attention preparation")   # (moved out of k_layer.cu by 1f19857)
lay = layer[a:] if b < 0 else layer[a:b]
a = moe.index("__device__ __forceinline__ float dev_softplus"); b = moe.index("__device__ __forceinline__ float dev_silu")
mo = moe[a:b]
mo = mo.replace("extern __shared__ int plan_smem[];", "static int plan_smem[1 << 16];\n    if (threadIdx.x == 0) shim_poison(plan_smem, sizeof plan_smem);")
mo = mo.replace("extern __shared__ unsigned long long plan_fast_smem[];",
                "static unsigned long long plan_fast_smem[1 << 13];\n    if (threadIdx.x == 0) shim_poison(plan_fast_smem, sizeof plan_fast_smem);")
assert "extern __shared__" not in mo
def mutate(text, old, new):
    assert text.count(old) == 1, old
    return text.replace(old, new)
if v == "1" and bug == "pre":     # the stream sum in another order
    lay = mutate(lay, "for (int i = 0; i < 4; i++) a += pre[i] * xv[i * M + c];", "for (int i = 3; i >= 0; i--) a += pre[i] * xv[i * M + c];")
if v == "1" and bug == "rms":     # the packing scale of the wrong half
    top = mutate(top, "if ((k & 127) == 0) qs[2 * c + half] = sc;", "if ((k & 127) == 0) qs[2 * c + 1 - half] = sc;")
if v == "1" and bug == "post":    # comb transposed
    top = mutate(top, "s += cw[j * 4 + k] * old[j];", "s += cw[k * 4 + j] * old[j];")
if v == "1" and bug == "route":   # ties to the higher id
    mo = mutate(mo, "if (best < 0 || v > bv) { best = e; bv = v; bsc = sc[r]; }", "if (best < 0 || v >= bv) { best = e; bv = v; bsc = sc[r]; }")
if v == "1" and bug == "plan":    # a token's pairs counted from its own bit on
    mo = mutate(mo, "& ((1ull << (u & 63)) - 1)", "& ((2ull << (u & 63)) - 1)")
if v == "1" and bug == "planbig":  # k_moe_plan_big: a chunk's last mask word left out of base[]
    mo = mutate(mo, "for (int w = 0; w < PLAN_BIG_W; w++) b +=", "for (int w = 0; w < PLAN_BIG_W - 1; w++) b +=")
body = poison_shared(top + "\n" + lay + "\n" + mo)
body = body.replace('extern "C" ', '')
n0 = body.count("<<<")
body, n = launches(body, r"k_\w+(?:<[^<>;]*>)?")
assert "<<<" not in body, n0
out.append(body)
out.append('}')
open(out_path, "w").write("\n".join(out))
PY
g++ -O2 -std=c++17 -w -DDSV4_MHC_FAST=$v -DDSV4_MOE_FAST=$v -Iinclude -Isrc -Itools/gpu/shim -c "$D/mhc_kernels_v$v.cpp" -o "$D/mhc_kernels_v$v.o" &
pids+=($!)
done
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
g++ -O2 -std=c++17 -Wall -Wextra -Iinclude -Isrc -Itools/gpu/shim -c tools/gpu/shim/shim_mhc_test.cpp -o "$D/test.o"
for p in "${pids[@]}"; do wait "$p"; done
g++ -o "$D/shim_mhc_test" "$D/test.o" "$D/mhc_kernels_v0.o" "$D/mhc_kernels_v1.o" "$D/cuda_shim.o"
"$D/shim_mhc_test"
