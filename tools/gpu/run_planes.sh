#!/usr/bin/env bash
# FP4 nibble planes (model/fp4_planes.h) on the lent machine's host: the kernel alone (.gpu/linear_bench with
# LINEAR_BENCH_PLANES=1: the same matrices in both layouts, passes alternated) at PLANES_THREADS (default 1 15; a
# blank value such as " " skips it) threads, one token, from memory; then Flash with --gpu-mem PLANES_MEM (default 72)
# --bus-share PLANES_SHARE (default 0.15) and PLANES_FLASH_ARGS (more bench options), DSV4_CPU_FP4_PLANES=0 and =1
# alternated PLANES_ROUNDS times (default 2); then (PLANES_CPU=1, the default; 0 skips it) a CPU model, flash-2g on the
# host's cores (bench options PLANES_CPU_ARGS, default a 128-token prefill, 32 decoded, 16 streams), the switch off
# and on PLANES_CPU_ROUNDS times. Stage: tools/gpu/stage.sh, then `tools/gpu/run_planes.sh stage` here (links
# .gpu/linear_bench); carry [".gpu"]. Logs in $OUT/planes.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = stage ]; then
  cc -std=gnu11 -O3 -march=x86-64-v3 -Iinclude -Isrc tools/bench/linear_bench.c build-gpu/libdsv4.a -Wl,-Bstatic -lmicrohttpd \
    -ljansson -lpcre2-8 -lxxhash -Wl,-Bdynamic -lgnutls -lm -pthread -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lstdc++ \
    -o .gpu/linear_bench && strip .gpu/linear_bench && exit 0
  exit 1
fi
. tools/gpu/env.sh
L=/tmp/planes-logs && rm -rf $L && mkdir -p $L
for b in .gpu/dsv4*.xz; do [ -f "$b" ] && xz -dkf "$b" && chmod +x "${b%.xz}"; done
export LD_LIBRARY_PATH=$PWD/.gpu/lib
echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads"
for th in ${PLANES_THREADS:-1 15}; do
  for shape in "4096 2048" "2048 4096"; do
    LINEAR_BENCH_PLANES=1 timeout 120 .gpu/linear_bench $th 1 $shape >$L/lb_${th}_${shape// /x}.log 2>&1
    echo "  linear_bench $th threads, 1 token, $shape: $(grep -E 'FP4|outputs' $L/lb_${th}_${shape// /x}.log | tr -s ' ' | tr '\n' ' ')"
  done
done
for r in $(seq ${PLANES_ROUNDS:-2}); do
  for p in 0 1; do
    DSV4_CPU_FP4_PLANES=$p timeout 120 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --gpu-mem ${PLANES_MEM:-72} \
      --bus-share ${PLANES_SHARE:-0.15} --prompt 64 --decode 16 --no-bandwidth ${PLANES_FLASH_ARGS:-} >$L/flash_${r}_$p.log 2>&1
    echo "  planes=$p (exit $?): $(grep -E '^prefill |^decode, 1|^host, a decode|^host expert reads|^ +[0-9]+ +[0-9.]+ +[0-9.]+x' $L/flash_${r}_$p.log | tr -s ' ' | cut -c1-120 | tr '\n' '|')"
    grep -o '[0-9]* in nibble planes' $L/flash_${r}_$p.log | head -1 | sed 's/^/    /'
  done
done
CPU_ARGS=${PLANES_CPU_ARGS:-"--prompt 128 --decode 32 --streams 16 --warmup"}
# then a CPU model (PLANES_CPU=0 skips): flash-2g in official mode on the host's cores, the switch off and on alternated
for r in $(seq ${PLANES_CPU_ROUNDS:-2}); do
  [ "${PLANES_CPU:-1}" = 1 ] || break
  for p in 0 1; do
    DSV4_CPU_FP4_PLANES=$p timeout 150 .gpu/dsv4 bench --synthetic flash-2g --mode official $CPU_ARGS >$L/cpu_${r}_$p.log 2>&1
    echo "  cpu flash-2g planes=$p (exit $?): $(grep -E '^memory read|^prefill |^decode, 1|^bandwidth fraction|^ +16 ' $L/cpu_${r}_$p.log | tr -s ' ' | cut -c1-60 | tr '\n' '|')"
  done
done
tar -C /tmp -czf "$OUT/planes.tgz" planes-logs 2>/dev/null
