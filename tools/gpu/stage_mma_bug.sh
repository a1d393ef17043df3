#!/usr/bin/env bash
# After tools/gpu/stage.sh: test_gpu_mma built with -DDSV4_MMA_BUG (k_mma.cu swaps two activation words of one MMA)
# as .gpu/test_gpu_mma-bug, for tools/gpu/run_mma.sh to show that the test fails on a fragment bug.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-gpu-mmabug
rm -rf "$B" && cp -a build-gpu "$B" && rm -f "$B/src/backend/cuda/k_mma.o"
make CUDA=1 BUILD="$B" OPT="-O3 -march=x86-64-v3" STATIC_DEPS=1 \
    NVFLAGS="-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -DDSV4_MMA_BUG" "$B/gputests/test_gpu_mma" >/dev/null
strip -o .gpu/test_gpu_mma-bug "$B/gputests/test_gpu_mma"
ls -la .gpu/test_gpu_mma-bug
