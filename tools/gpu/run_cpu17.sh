#!/usr/bin/env bash
# Issue 17 on the lent machine's host CPU (a Xeon with AVX512-BF16 and AMX; 16 cores): the pair order's
# kernels (src/backend/cpu/pairs.h). Stage with tools/gpu/stage.sh, then `tools/gpu/run_cpu17.sh stage` here
# (copies the CPU unit tests into .gpu/cputests); carry [".gpu"]. On the device: PARTS picks (default all):
#   cpu     lscpu's model and flags; the kernel set chosen; test_linear_bf16, test_isa, test_moe_grouped
#   bench   flash-2g, OFFICIAL with the weights copied to huge pages and in the file mapping (DSV4_WEIGHT_MEMORY;
#           ROUNDS alternating rounds), --amx, EXACT; then --streams 1,16,64 for both memories
#   linear  .gpu/linear_bench (tools/bench/linear_bench.c, linked statically by hand): one pair-order linear per
#           weight format at 1, 8 and 16 threads
#   scale   flash-2g OFFICIAL decode at SCALE_THREADS (default 4 8 16) threads, each with every SCALE_ENV setting
#           (space-separated; VAR=value, several joined by +), with the bench's pool line
#   targets issue 17's table on this host: flash-2g with the bench's bandwidth probe, OFFICIAL --prompt 128 --decode 32
#           --streams 1,16,64 --profile (TARGET_ROUNDS rounds, default 2, of each binary in TARGET_BINS, default dsv4),
#           then EXACT --prompt 128 --decode 32; TARGET_ARGS: more bench arguments for both (e.g. --warmup)
#   suite   the GPU suite (tests/run_gpu.sh)
#   hostx   Flash on the GPU with --gpu-mem HOSTX_MEM (default 80: about half the routed experts in host memory,
#           computed by the CPU): decode with each HOSTX_ENV setting (default: the pair order, then DSV4_CPU_PAIRS=0)
# Logs in $OUT/logs.tgz; a summary on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = stage ]; then
  mkdir -p .gpu/cputests
  for t in test_linear_bf16 test_isa test_moe_grouped; do strip -o ".gpu/cputests/$t" "build-gpu/tests/$t"; done
  tar -C .gpu -cf - cputests | xz -9 -T0 >.gpu/cputests.tar.xz && rm -rf .gpu/cputests   # the carry limit: 64 MiB
  exit 0
fi
. tools/gpu/env.sh
PARTS=${PARTS:-cpu bench suite}
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
L=/tmp/run-logs && rm -rf $L && mkdir -p $L
save() { tar -C /tmp -czf "$OUT/logs.tgz" run-logs 2>/dev/null; }
for b in .gpu/dsv4*.xz; do [ -f "$b" ] && xz -dkf "$b" && chmod +x "${b%.xz}"; done
export LD_LIBRARY_PATH=$PWD/.gpu/lib
[ -f .gpu/cputests.tar.xz ] && tar -C .gpu -xJf .gpu/cputests.tar.xz
if has cpu; then
  echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads; flags: $(grep -o -w -E 'avx512_bf16|amx_bf16|amx_tile|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  .gpu/dsv4 --version 2>&1 | tee $L/version.log | grep -i -E "isa|kernel|set" | head -3
  for t in test_linear_bf16 test_isa test_moe_grouped; do
    timeout 200 .gpu/cputests/$t >$L/$t.log 2>&1
    echo "  $t: exit $? $(grep -E 'PASSED|FAILED|kernel sets here' $L/$t.log | tr '\n' ' ' | tr -s ' ')"
  done
fi
save
B=".gpu/dsv4 bench --synthetic flash-2g --no-bandwidth"
one() {   # name, env, args
  local n=$1 e=$2; shift 2
  env $e timeout 240 $B "$@" >$L/bench_$n.log 2>&1
  echo "  $n: $(grep -E '^prefill|^decode, 1|^speculative|^bandwidth fraction' $L/bench_$n.log | awk '{printf "%s ", $0}' | tr -s ' ')"
}
if has bench; then
  timeout 240 .gpu/dsv4 bench --synthetic flash-2g --prompt 4 --decode 2 >$L/bench_warm.log 2>&1
  echo "== bench flash-2g (16 threads); $(grep -E '^memory read bandwidth' $L/bench_warm.log)"
  for r in $(seq 1 "${ROUNDS:-2}"); do   # the weights copied to huge pages (the default) against the file mapping
    one "copy_$r" DSV4_WEIGHT_MEMORY=copy --mode official --decode 32
    one "map_$r" DSV4_WEIGHT_MEMORY=map --mode official --decode 32
  done
  one amx DSV4_CPU_PAIRS=1 --mode official --decode 32 --amx
  one exact DSV4_CPU_PAIRS=1 --mode exact --decode 32
  for v in copy map; do
    env DSV4_WEIGHT_MEMORY=$v timeout 300 $B --mode official --prompt 16 --decode 16 --streams 1,16,64 >$L/streams_$v.log 2>&1
    echo "  streams, DSV4_WEIGHT_MEMORY=$v:"; grep -E "streams|roofline" $L/streams_$v.log | tail -4 | sed 's/^/    /'
  done
fi
save
if has linear && [ -x .gpu/linear_bench ]; then   # tools/bench/linear_bench.c, built statically into .gpu by hand
  echo "== one linear per format (2048 x 4096, 1 GB of each cycled), GB/s of weights:"
  for a in "1 1" "8 1" "16 1" "16 4"; do
    set -- $a
    timeout 120 .gpu/linear_bench $1 $2 >$L/linear_$1_$2.log 2>&1
    echo "  $1 threads, $2 token(s), blocks / equal shares: $(grep -E 'GB/s' $L/linear_$1_$2.log | awk '{printf "%s %s / %s  ", $1, $2, $(NF-1)}')"
  done
fi
save
if has scale; then   # where a decode step's CPU time goes (the bench's pool line) by thread count; SCALE_ENV: A/B settings
  echo "== flash-2g OFFICIAL decode by threads (pool: serial + shares + waiting; busy; start latency):"
  for t in ${SCALE_THREADS:-4 8 16}; do
    for e in ${SCALE_ENV:-X=0}; do
      env $(echo $e | tr + " ") timeout 120 $B --mode official --prompt 16 --decode 32 --threads $t >$L/scale_${t}_$e.log 2>&1
      echo "  $t threads $e: $(grep -E '^decode, 1' $L/scale_${t}_$e.log | tr -s ' ')"
      echo "    $(grep -E '^decode, CPU thread pool' $L/scale_${t}_$e.log | tr -s ' ' | cut -c 25-)"
    done
  done
fi
save
if has hostx; then
  echo "== Flash --gpu-mem ${HOSTX_MEM:-80} (host experts on the CPU):"
  for v in ${HOSTX_ENV:-DSV4_CPU_PAIRS=1 DSV4_CPU_PAIRS=0}; do
    env $(echo $v | tr + " ") timeout 280 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --gpu-mem ${HOSTX_MEM:-80} \
        --prompt 64 --decode 16 --no-bandwidth >$L/hostx_$v.log 2>&1
    echo "  $v: $(grep -E '^prefill|^decode, 1|host' $L/hostx_$v.log | head -4 | tr '\n' ' ' | tr -s ' ')"
    echo "    $(grep -E '^decode, CPU thread pool' $L/hostx_$v.log | tr -s ' ' | cut -c 25-)"
  done
fi
save
if has targets; then
  echo "== issue 17's targets, flash-2g, every core:"
  for r in $(seq 1 "${TARGET_ROUNDS:-2}"); do   # TARGET_BINS: binaries of .gpu alternated each round (default dsv4)
    for b in ${TARGET_BINS:-dsv4}; do
      timeout 300 .gpu/$b bench --synthetic flash-2g --mode official --prompt 128 --decode 32 --streams 1,16,64 --profile ${TARGET_ARGS:-} \
          >$L/targets_official_${b}_$r.log 2>&1
      echo "  $b official round $r: $(grep -E '^memory read|^prefill  |^decode, 1|^bandwidth fraction|^decode, CPU' $L/targets_official_${b}_$r.log | cut -c 1-150 | tr '\n' '|' | tr -s ' ')"
      grep -E "^ +(1|16|64) +[0-9]" $L/targets_official_${b}_$r.log | sed 's/^/    /'
      grep -E "mHC" $L/targets_official_${b}_$r.log | tr -s ' ' | sed 's/^/    /'
    done
  done
  timeout 200 .gpu/dsv4 bench --synthetic flash-2g --mode exact --prompt 128 --decode 32 ${TARGET_ARGS:-} >$L/targets_exact.log 2>&1
  echo "  exact: $(grep -E '^memory read|^prefill  |^decode, 1|^bandwidth fraction' $L/targets_exact.log | tr '\n' '|' | tr -s ' ')"
fi
save
if has suite; then
  BUILD=.gpu VERBOSE=1 timeout ${SUITE_TIMEOUT:-200} tests/run_gpu.sh >$L/suite.log 2>&1
  echo "== GPU suite: exit $?"; grep -E "FAIL|passed, .* failed" $L/suite.log | tail -6
fi
save
