#!/usr/bin/env bash
# After tools/gpu/stage.sh: test_gpu_attention built with -DATT_BLOCK_TIMES=1 (k_attention.cu: the decode attention
# kernels record each block's start, end and SM), as .gpu/test_gpu_attention-times; on the GPU machine
# `test_gpu_attention-times --times` prints where each launch's time goes (gap before it, its blocks' start spread,
# their durations; then with k_att_scores_dec launched twice in a row). A measuring build. With arguments SUFFIX
# FLAGS: another such build with more nvcc flags, .gpu/test_gpu_attention-times-SUFFIX (e.g. s2
# -DATT_DEC_STAGE=2: k_att_scores_dec with 256 threads, as before run 86).
set -euo pipefail
cd "$(dirname "$0")/../.."
SUFFIX=${1:+-$1} EXTRA=${2:-}
B=build-gpu-times$SUFFIX
rm -rf "$B" && cp -a build-gpu "$B"
rm -f "$B/src/backend/cuda/k_attention.o"
make CUDA=1 BUILD="$B" OPT="-O3 -march=x86-64-v3" STATIC_DEPS=1 \
    NVFLAGS="-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -fmad=false -DATT_BLOCK_TIMES=1 $EXTRA" \
    "$B/gputests/test_gpu_attention" >/dev/null
strip -o ".gpu/test_gpu_attention-times$SUFFIX" "$B/gputests/test_gpu_attention"
md5sum ".gpu/test_gpu_attention-times$SUFFIX"
