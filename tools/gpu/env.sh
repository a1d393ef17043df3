# Sourced (not run) by the tools/gpu run scripts on the GPU machine, from the repository root: $OUT for the logs
# that come back, the GPU test programs unpacked, the staged shared libraries and test data, and el (seconds since
# the script began).
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
tools/gpu/unpack.sh
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}"
export DSV4_TESTDATA="$PWD/.gpu/testdata" DSV4_ROOT="$PWD"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
