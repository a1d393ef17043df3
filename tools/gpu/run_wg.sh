#!/usr/bin/env bash
# On the GPU machine: native FP8 wgmma for decode-sized linears (tools/gpu/wg_gemv.cu, staged as .gpu/bin/wg_gemv)
# beside today's kernels on the same shapes (test_gpu_mma --bench, --bench-experts). Logs under $OUT/wg; a short
# table last. WG_NPS: the partial counts to run (default "4 8 2").
cd "$(dirname "$0")/../.."
L=${OUT:-/tmp}/wg
mkdir -p "$L"
bash tools/gpu/unpack.sh
export LD_LIBRARY_PATH=$PWD/.gpu/lib
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >"$L/gpu.txt" 2>&1
for np in ${WG_NPS:-4 8 2}; do timeout 150 .gpu/bin/wg_gemv "$np" >"$L/wg_np$np.log" 2>&1; echo "wg_gemv $np: rc $?" >>"$L/rc.txt"; done
timeout 150 .gpu/gputests/test_gpu_mma --bench >"$L/bench_linear.log" 2>&1; echo "bench: rc $?" >>"$L/rc.txt"
timeout 60 .gpu/gputests/test_gpu_mma --bench-experts >"$L/bench_experts.log" 2>&1; echo "bench-experts: rc $?" >>"$L/rc.txt"
cat "$L/gpu.txt" "$L/rc.txt"
for f in "$L"/wg_np*.log; do echo "== $f"; cat "$f"; done
echo "== today's kernels (test_gpu_mma --bench, T <= 8)"
grep -E "^(FP8|FP4)" "$L/bench_linear.log" | awk '$3 <= 8'
echo "== experts"; tail -15 "$L/bench_experts.log"
