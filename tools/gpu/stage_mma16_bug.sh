#!/usr/bin/env bash
# After tools/gpu/stage.sh: test_gpu_mma16 built with -DDSV4_MMA16_BUG (k_mma16.cu swaps the token's two words in the
# first MMA of each chunk) as .gpu/test_gpu_mma16-bug, for tools/gpu/run_mma16.sh to show that the test fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-gpu-mma16bug
rm -rf "$B" && cp -a build-gpu "$B" && rm -f "$B/src/backend/cuda/k_mma16.o"
make CUDA=1 BUILD="$B" OPT="-O3 -march=x86-64-v3" STATIC_DEPS=1 \
    NVFLAGS="-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -DDSV4_MMA16_BUG" "$B/gputests/test_gpu_mma16" >/dev/null
strip -o .gpu/test_gpu_mma16-bug "$B/gputests/test_gpu_mma16"
ls -la .gpu/test_gpu_mma16-bug
