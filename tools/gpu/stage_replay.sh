#!/usr/bin/env bash
# After tools/gpu/stage.sh: .gpu/dsv4-replay, a measuring build (-DDIAG_REPLAY, cuda_step.c) whose graphed steps
# launch each segment's executable graph as first captured, without capturing again: the GPU's time of a step
# without the host's captures, edits and updates. Its results are wrong; only its timings are read.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-gpu-replay
rm -rf "$B" && cp -a build-gpu "$B"
rm -f "$B/src/backend/cuda/cuda_step.o"
make CUDA=1 BUILD="$B" OPT="-O3 -march=x86-64-v3 -DDIAG_REPLAY" STATIC_DEPS=1 "$B/dsv4" >/dev/null
strip -o .gpu/dsv4-replay "$B/dsv4"
md5sum .gpu/dsv4-replay
