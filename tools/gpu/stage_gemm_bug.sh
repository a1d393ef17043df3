#!/usr/bin/env bash
# After tools/gpu/stage.sh: test_gpu_gemm built with -DDSV4_GEMM_BUG=1 (k_mma_gemm.cu swaps two activation words of
# one MMA) and =2 (its partials folded in reverse order) as .gpu/test_gpu_gemm-bug1 / -bug2, for tools/gpu/run_gemm.sh
# to show that the test fails on a fragment bug and on an order bug.
set -euo pipefail
cd "$(dirname "$0")/../.."
for n in 1 2; do
  B=build-gpu-gemmbug$n
  rm -rf "$B" && cp -a build-gpu "$B" && rm -f "$B/src/backend/cuda/k_mma_gemm.o"
  make CUDA=1 BUILD="$B" OPT="-O3 -march=x86-64-v3" STATIC_DEPS=1 \
      NVFLAGS="-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -DDSV4_GEMM_BUG=$n" "$B/gputests/test_gpu_gemm" >/dev/null
  strip -o ".gpu/test_gpu_gemm-bug$n" "$B/gputests/test_gpu_gemm"
done
ls -la .gpu/test_gpu_gemm-bug*
