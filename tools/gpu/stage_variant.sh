#!/usr/bin/env bash
# After tools/gpu/stage.sh: a second dsv4 binary with extra nvcc flags, for an A/B in one device call
# (tools/gpu/run_ab.sh compares .gpu/dsv4 with .gpu/dsv4-old). Usage: stage_variant.sh NAME "FLAGS"
# e.g. stage_variant.sh dsv4-old "-DLIN_ONE_TOKEN=0"; FMAD=-fmad=true for nvcc's FMA contraction (the default
# before run 42). Only the CUDA objects are rebuilt (build-gpu-NAME/). TARGET: another program of the build than dsv4
# (e.g. TARGET=gputests/test_gpu_indexer ONLY=k_indexer: a test program with one kernel file's variant).
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=$1 FLAGS=$2
B=build-gpu-$NAME
rm -rf "$B" && cp -a build-gpu "$B"
if [ -n "${ONLY:-}" ]; then   # ONLY="k_layer k_moe": rebuild just these kernel files (the flags touch nothing else)
  for k in $ONLY; do rm -f "$B/src/backend/cuda/$k.o"; done
else
  find "$B" -path '*backend/cuda/*.o' -name 'k_*.o' -delete
fi
make CUDA=1 BUILD="$B" OPT="-O3 -march=x86-64-v3" STATIC_DEPS=1 \
    NVFLAGS="-gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo ${FMAD:--fmad=false} $FLAGS" "$B/${TARGET:-dsv4}" >/dev/null
strip -o ".gpu/$NAME" "$B/${TARGET:-dsv4}"
md5sum ".gpu/$NAME"
