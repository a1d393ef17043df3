#!/usr/bin/env bash
# On the lent GPU machine (.gpu/ carried): Nsight Systems over a short `bench --synthetic flash` run, every kernel
# of the CUDA graphs traced as its own node, then tools/gpu/nsys_summary.py over its kernels: a decode step's span,
# the time some kernel ran and the time none did (the gaps of the step's dependent chain), and the kernels by their
# time a step. Unlike ncu (each kernel replayed alone, at fixed clocks), this is the step as it runs.
# NSYS_ARGS: the bench's arguments (default a 64-token prompt and 16 decoded tokens); BIN: .gpu/dsv4 by default.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}"
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -z "$NSYS" ]; then echo "nsys: not on this machine"; exit 0; fi
echo "nsys: $NSYS ($("$NSYS" --version 2>&1 | head -1))"
R=/tmp/nsys-step && rm -rf $R && mkdir -p $R
timeout "${NSYS_SECONDS:-240}" "$NSYS" profile -o $R/step --force-overwrite true --trace=cuda --cuda-graph-trace=node \
    --sample=none --cpuctxsw=none ${BIN:-.gpu/dsv4} bench --synthetic ${MODEL:-flash} --device cuda --mode official \
    ${NSYS_ARGS:---prompt 64 --decode 16 --no-bandwidth} >$R/bench.log 2>&1
echo "nsys profile exit $?"; grep -E "^decode, 1|^speculative|^verify" $R/bench.log
"$NSYS" export --type sqlite -o $R/step.sqlite --force-overwrite true $R/step.nsys-rep >$R/export.log 2>&1 || tail -3 $R/export.log
python3 tools/gpu/nsys_summary.py $R/step.sqlite ${NSYS_STEP_FIRST:-k_embed} | tee "$OUT/nsys.txt"
