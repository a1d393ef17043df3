#!/usr/bin/env bash
# After tools/gpu/stage.sh: the measuring builds of a decode step's critical-path attribution (runs 73-75), one
# .gpu/dsv4-skipN.xz for each N in SKIP_GROUPS (default "1 2 3 4 8 16 32"): DIAG_SKIP=N (cu_common.cuh) makes the
# launchers of the groups in N's bits return without launching, so `dsv4 bench` with that binary times the step
# without them; default - skip = the group's share of the step's critical path. Their outputs are wrong: never a
# real build, and a multi-token step without the dense linears (bit 1) also loses the router's gate (every token
# keeps the same routing). Then, e.g.:
#   PARTS=ab VARIANTS="dsv4-skip1 dsv4-skip2 ..." bash tools/gpu/run_s7.sh
# carrying only the binaries and .gpu/lib when the whole .gpu is too large for the device tool.
set -euo pipefail
cd "$(dirname "$0")/../.."
for n in ${SKIP_GROUPS:-1 2 3 4 8 16 32}; do
  ONLY="k_mma k_mma16 k_attention k_layer" tools/gpu/stage_variant.sh "dsv4-skip$n" "-DDIAG_SKIP=$n" >/dev/null
  xz -9 -T2 -f ".gpu/dsv4-skip$n"
  echo ".gpu/dsv4-skip$n.xz"
done
