#!/usr/bin/env bash
# Runs tools/gpu/shim/shim_linear_test.cpp on the CPU against the very source of the CUDA-core linear kernels
# (src/backend/cuda/k_linear.cu) through tools/gpu/shim/cuda_shim.h: the split rows' tile kernel (many tokens) must
# give k_linear_split's bytes (each token alone), F32 weights of the mHC mixes' and other shapes; built with the tile
# kernel from 16 tokens (SPT_MIN_T: which kernel a step takes, never what it computes) so that small T test it. ~3 min.
# LIN_BUG=quad mutates the tile kernel (its column quads in reverse order) so that the test must fail. Not part of
# `make test` nor of the GPU suite; needs no build of the project.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${SHIM_DIR:-/tmp/dsv4-shim-linear}
mkdir -p "$D"
python3 - "$D/linear_kernels.cpp" "${LIN_BUG:-}" <<'PY'
import sys
sys.path.insert(0, "tools/gpu/shim")
from shim_src import poison_shared, launches
out_path, bug = sys.argv[1], sys.argv[2]
common = open("src/backend/cuda/cu_common.cuh").read()
lin = open("src/backend/cuda/k_linear.cu").read()
out = ['#include "cuda_shim.h"', 'extern "C" {', '#include "backend/cuda/cu_kernels.h"', '#include "model/expert_place.h"', '}',
       # fp16 bits -> float for the weights section's FP8 helpers (unused by F32 rows, but compiled)
       'static inline unsigned short __ushort_as_half(unsigned short h) { return h; }',
       'static inline float __half2float(unsigned short h) {',
       '    const int e = (h >> 10) & 31, m = h & 1023; const float s = (h & 0x8000) ? -1.0f : 1.0f;',
       '    return e == 0 ? s * ldexpf((float)m, -24) : e == 31 ? (m ? NAN : s * INFINITY) : s * ldexpf((float)(m | 1024), e - 25); }']
a = common.index("/* ---- number formats"); b = common.rindex("#endif")   # number formats, reductions, weights
out.append(common[a:b])
a = lin.index("#define LIN_WARPS")
body = lin[a:]
if bug == "quad":
    old = "for (int q = 0; q < LIN_LANE / 4; q++) {\n            float4 xv[SPT_TOKENS];"
    assert body.count(old) == 1
    body = body.replace(old, "for (int q = LIN_LANE / 4 - 1; q >= 0; q--) {\n            float4 xv[SPT_TOKENS];")
body = poison_shared(body).replace('extern "C" ', '')
body, n = launches(body, r"k_\w+(?:<[^<>;]*>)?")
assert "<<<" not in body
out.append(body)
open(out_path, "w").write("\n".join(out))
PY
g++ -O2 -std=c++17 -w -DDEV_HW_DECODE=0 -DDEV_HW_E4M3=0 -DSPT_MIN_T=16 -Iinclude -Isrc -Itools/gpu/shim -c "$D/linear_kernels.cpp" -o "$D/kernels.o" &
g++ -O2 -std=c++17 -Wall -Itools/gpu/shim -c tools/gpu/shim/cuda_shim.cpp -o "$D/cuda_shim.o"
g++ -O2 -std=c++17 -Wall -Wextra -Iinclude -Isrc -Itools/gpu/shim -c tools/gpu/shim/shim_linear_test.cpp -o "$D/test.o"
wait
gcc -O2 -std=gnu11 -Iinclude -Isrc -c src/model/weight.c -o "$D/weight.o"   # weight_rows (cu_linear_grouped)
g++ -o "$D/shim_linear_test" "$D/test.o" "$D/kernels.o" "$D/weight.o" "$D/cuda_shim.o"
"$D/shim_linear_test"
