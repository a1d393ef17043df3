#!/usr/bin/env bash
# Device calls of session 2026-12-02b (runs 38-): stage tools/gpu/stage.sh, the variants named in VARIANTS
# (tools/gpu/stage_variant.sh, xz) and .gpu/dsv4-old.xz (a build of 0344277, before this session's fusions), and
# tools/gpu/fuzz_stage.sh; carry [".gpu", ".fuzz"]. PARTS picks what runs (default all):
#   suite    the GPU suite
#   (an ENV_BITS / ENV_AB entry NAME=V+NAME2=V2 sets both variables in one run)
#   one      the GPU test programs named in ONE_TESTS (default test_gpu_attention) alone
#   times    where the decode attention kernels' time goes, block by block (tools/gpu/stage_times.sh's build)
#   suite2   the GPU suite again with SUITE_ENV (NAME=V NAME2=V2) exported
#   bits     logits of dsv4 = dsv4-old (three models x fp8 / bf16 KV, one call; cmp) and of each runtime switch
#   ab       Flash decode at prompt 256: dsv4, dsv4-old, each staged variant, DSV4_CUDA_PDL=1 / 2, ENV_AB switches
#            (AB_ARGS: more bench arguments, e.g. "--kv fp8"; the bench's default KV rows are f32)
#            (an ENV_AB entry BIN/NAME=V runs the staged binary BIN with NAME=V)
#   micro    test_gpu_mma --bench-experts and --bench, test_gpu_gemm --bench, test_gpu_attention --bench (MICRO picks:
#            experts linear gemm attention, default all; gemmexp: test_gpu_gemm --bench-experts)
#   san      compute-sanitizer (SAN_TOOL) over test_gpu_mma's tests matching SAN_TESTS
#   sansuite compute-sanitizer (each tool of SANSUITE_TOOLS, default synccheck) over each GPU test program of
#            SANSUITE_TESTS (default every one), SANSUITE_TIMEOUT (default 60) s each, SANSUITE_ENV (NAME=V ...) set: the
#            summary line of each
#   ncu      ncu over one decode step (caches not flushed): time per kernel
#   ktrace   bench --kernel-trace (CUPTI, in dsv4 itself: the step as it runs, graph nodes included) at --prompt 64
#            --decode 16, with graphs and with DSV4_CUDA_GRAPHS=0 (KTRACE_ARGS: more bench arguments; $OUT/ktrace*.json)
#   kvab     decode at prompt 256 with f32, bf16 and fp8 KV
#   ncukv    ncu over a one-token step with f32 and with fp8 KV (NCUKV_KV picks): $OUT/ncu_f32.txt, ncu_fp8.txt
#   sass     cuobjdump's SASS of test_gpu_mma's kernels named in SASS_FUN (comma list): $OUT/sass.txt
#   ncusrc   ncu's per-instruction source page of the launches in NCU_SRC (regex:skip[:options], NCU_SRC_PROG (test_gpu_mma)
#            with the options, '+' for a space (--bench-experts; e.g. k_att_scores_dec:5:--bench+csa))
#   ncudeep  ncu's sections (throughput, occupancy, warp stalls, memory) for a few launches of the kernels in NCU_DEEP
#            (default: the routed experts and the linears, in test_gpu_mma's micro-benchmarks; NCU_DEEP_PROG: another
#            test program, e.g. test_gpu_attention): $OUT/ncu_deep.txt
#   gemmab   8K prefill with DSV4_CUDA_GEMM=1 and 2 (GEMMAB_KINDS, GEMMAB_ROUNDS), a --profile of the last, and
#            compute-sanitizer memcheck + racecheck over test_gpu_gemm (GEMMAB_SAN=0 skips them)
#   profile  bench --profile: an 8K prefill, a decode step, and the 64-stream decode step, per stage
#   final    decode, 8 / 32 / 64 / 128 / 256 streams, the verify step, an 8K prefill, decode after 4K / 128K / 1M (fp8 KV)
#   ncuatt   an 8K prefill's attention and indexer kernels under ncu: time per kernel name ($OUT/ncu_att.txt), then
#            ncu's sections for NCU_ATT_COUNT launches of k_att_ from NCU_ATT_SKIP (default 60: layer 2's first group)
#   pfab     8K prefill (PFAB_PROMPT, PFAB_CHUNK) of dsv4 and each binary of VARIANTS, PFAB_ROUNDS alternating rounds,
#            then each one's --profile attention, indexer and routed-experts lines (PFAB_ARGS: more bench arguments)
#   sab      decode of SAB_STREAMS streams (default 8,64,256) for dsv4 and each binary of VARIANTS, SAB_ROUNDS rounds
#   sprof    --profile of the decode steps of each stream count in SPROF_STREAMS (default 32 256): where a step goes
#   long     a 128K-token prefill in steps of LONG_CHUNK (default 8192) with --profile (LONG_PROMPT, LONG_TIMEOUT;
#            LONG_RUNS: default and / or NAME=V entries, one run each)
#   bus      issue 15's bus share: Flash with --gpu-mem BUS_MEM (default 80) at each --bus-share of BUS_SHARES (default
#            0 0.5; an entry tF: F with --bus-by-token), --prompt 64 --decode 16 (BUS_ARGS: more); the load time, decode,
#            prefill and the host lines of each
#   ahead    issue 15: Flash with --gpu-mem AHEAD_MEM (default 80, 72 on an 80 GB card), --prompt 64 --decode 16, for each
#            entry [BIN:]A[tN] of AHEAD_RUNS (default 1 0): the staged binary .gpu/BIN (default dsv4) with DSV4_CUDA_HX_AHEAD=A
#            (steps with host experts enqueued ahead against launched directly), tN: --threads N
#   aheadtrace  issue 15: the kernel trace (bench --kernel-trace, CUPTI as for ktrace) of Flash with --gpu-mem AHEAD_MEM for
#            each DSV4_CUDA_HX_AHEAD value of AHEAD_RUNS (default 0 1 1g0 1p0; g0: DSV4_CUDA_GRAPHS=0, p0: DSV4_CUDA_PDL=0;
#            BIN:A runs the staged binary .gpu/BIN, e.g. dsv4-old:1): which kernels a
#            split step enqueued ahead runs longer than one launched directly, and the GPU's idle time ($OUT/aheadtrace_<a>.json);
#            then tools/gpu/trace_gaps.py over them: the host's turn and the GPU's stretch between two hand-offs
#   link     issue 15: .gpu/hx_link_bench (tools/bench/hx_link_bench.cu, nvcc by hand): the round trip of one flag between
#            the host and a waiting kernel through mapped memory, over poll interval x pollers x host memory load
#   skew     issue 15's skewed routing: for each S of SKEWS (default 0.1; 0 = the plain synthetic model), Flash with
#            --route-skew S: the bench at --gpu-mem SKEW_BASE_MEM (default 80) with no profile (even placement; SKEW_EVEN=0
#            skips it), a
#            dsv4 profile over 16 prompts of 128 random ids (written next to the model, where loads find it; or the one
#            in .gpu/profiles/skew_S_profile.json, an earlier run's: the model must exist before dsv4 profile), then
#            the bench at each --gpu-mem of SKEW_MEMS (default 132 80 24) placed by it; each run's route shares
#   cpuflash issue 15's all-CPU baseline: `dsv4 bench --synthetic flash` on the host's CPU (OFFICIAL, every core; the
#            weights generated in host memory, model/synthetic.h: ~8 GiB of non-expert tensors, the experts within
#            60 % of RAM and the rest sharing them in a cycle), then the same model split with GPU_MEM_CPU
#            (default 24) GiB on the GPU, back to back. CPUFLASH_ARGS (default --prompt 16 --decode 16).
# Everything but the summary on stdout goes to $OUT/logs.tgz, ncu.txt and fuzz.tgz: the device tool returns at most
# 8 files (run 37 lost its fuzz.tgz to a ninth).
. tools/gpu/env.sh
PARTS=${PARTS:-suite bits ab ncu profile final}
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
# the logs so far into $OUT after every part: a call cut at its time limit still brings back what ran (run 45 lost
# its suite log to the limit)
save() { tar -C /tmp -czf "$OUT/logs.tgz" run-logs 2>/dev/null; }
L=/tmp/run-logs && rm -rf $L && mkdir -p $L
for b in .gpu/dsv4*.xz; do [ -f "$b" ] && xz -dkf "$b" && chmod +x "${b%.xz}"; done
if [ -n "${FUZZ_SECONDS:-}" ]; then OUT="$OUT" FUZZ_TARGETS="${FUZZ_TARGETS:-}" tools/gpu/fuzz_bg.sh start "$FUZZ_SECONDS" "${FUZZ_CORES:-12}" >$L/fuzz_start.log; fi
FLASH=".gpu/dsv4 bench --synthetic flash --device cuda --mode official"
if has suite; then
  # each test's own log in $L/suite-tests (<i>.log; a test without <i>.rc had not finished at the timeout)
  TEST_LOG_DIR=$L/suite-tests BUILD=.gpu VERBOSE=1 timeout ${SUITE_TIMEOUT:-300} tests/run_gpu.sh >$L/suite.log 2>&1
  echo "suite exit $? at $(el) s" >>$L/suite.log
  echo "== suite:"; grep -E "FAIL|passed, .* failed|suite exit" $L/suite.log | tail -8
  for f in $L/suite-tests/*.log; do i=$(basename "$f" .log); [ -f "$L/suite-tests/$i.rc" ] || echo "  unfinished: test #$i: $(tail -c 300 "$f" | tr '\n' ' ')"; done
fi
save
if has one; then   # single GPU test programs (ONE_TESTS, names under .gpu/gputests), e.g. after a change to one kernel file
  for t in ${ONE_TESTS:-test_gpu_attention}; do
    timeout ${SUITE_TIMEOUT:-300} .gpu/gputests/$t >$L/one_$t.log 2>&1
    echo "== $t: exit $? ($(grep -cE '^\[       OK' $L/one_$t.log) ok, $(grep -cE '^\[  FAILED' $L/one_$t.log) failed)"
  done
fi
save
if has times; then   # test_gpu_attention --times from tools/gpu/stage_times.sh's -DATT_BLOCK_TIMES=1 build
  for b in .gpu/test_gpu_attention-times*.xz; do
    xz -dkf "$b" && chmod +x "${b%.xz}"
    n=$(basename "${b%.xz}")
    timeout 120 "${b%.xz}" --times >$L/$n.log 2>&1
    echo "== attention block times, $n: exit $?"; cat $L/$n.log
  done
fi
save
if has suite2; then   # the suite again with SUITE_ENV's switches exported (opt-in kernels through the model-level tests)
  env ${SUITE_ENV:-} BUILD=.gpu VERBOSE=1 timeout ${SUITE_TIMEOUT:-300} tests/run_gpu.sh >$L/suite2.log 2>&1
  echo "suite2 exit $? at $(el) s" >>$L/suite2.log
  echo "== suite with ${SUITE_ENV:-}:"; grep -E "FAIL|passed, .* failed|suite2 exit" $L/suite2.log | tail -8
fi
save
if has bits; then   # the same logits? dsv4 and every binary in BITS_BINS (default dsv4-old), and ENV_BITS switches of dsv4
  W=/tmp/wide
  .gpu/dsv4 tiny -o $W --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 \
      --set hidden_size=1024 --set q_lora_rank=1024 --set moe_intermediate_size=1024 --set o_lora_rank=512 >/dev/null 2>&1
  TOK=$(awk 'BEGIN{for(i=0;i<300;i++) printf "%s%d", (i?",":""), (i*37+3)%260}')
  echo "== bits (logits md5 of each build; the same letter = the same bytes):"
  for m in $W .gpu/testdata/official_calm/calmpro/checkpoint .gpu/serve-model; do
    for kv in fp8 "fp8 --chunks 200,60" bf16; do   # --chunks: 200 + 60 tokens, then 40 one-token steps (decode kernels)
      line="$(basename $m) $kv:"; declare -A seen=(); n=0
      for v in dsv4 ${BITS_BINS:-dsv4-old} ${ENV_BITS:-}; do
        case $v in *=*) e=${v//+/ }; b=dsv4 ;; *) e=; b=$v ;; esac
        [ -x .gpu/$b ] || { line="$line $v=missing"; continue; }
        env $e timeout 60 .gpu/$b logits -m $m --device cuda --mode official --kv $kv --tokens "$TOK" --out /tmp/bits.npy >>$L/bits.log 2>&1 || { line="$line $v=FAILED"; continue; }
        h=$(md5sum </tmp/bits.npy | cut -c1-32)
        [ -n "${seen[$h]:-}" ] || { seen[$h]=$(printf "\\x$(printf %x $((65 + n)))"); n=$((n + 1)); }
        line="$line $v=${seen[$h]}"
      done
      unset seen
      echo "$line" | tee -a $L/bits.sum
    done
  done
fi
save
if has ab; then   # decode at prompt 256, AB_ROUNDS alternating rounds: dsv4, each binary of VARIANTS, each ENV_AB NAME=VALUE (of dsv4)
  echo "== A/B, decode tok/s at prompt 256 (rounds alternate):"
  for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in dsv4 ${VARIANTS:-} ${ENV_AB:-}; do
      case $v in */*=*) b=${v%%/*}; e=${v#*/}; e=${e//+/ } ;; *=*) e=${v//+/ }; b=dsv4 ;; *) e=; b=$v ;; esac
      [ -x .gpu/$b ] || { echo "  $v: missing"; continue; }
      env $e timeout 90 .gpu/$b bench --synthetic flash --device cuda --mode official --prompt 256 --decode 32 --no-bandwidth ${AB_ARGS:-} \
          >$L/ab_${v//[=\/]/_}_$r.log 2>&1
      echo "  round $r $v: $(grep -E '^decode, 1 stream' $L/ab_${v//[=\/]/_}_$r.log | awk '{print $4, $5, $6, $7}')$(grep -m1 -i 'error' $L/ab_${v//[=\/]/_}_$r.log)"
      grep -E '^host a graphed' $L/ab_${v//[=\/]/_}_$r.log | sed 's/^host a graphed decode step */    host: /'
    done
  done
fi
save
if has micro; then   # the kernels' own benchmarks (MICRO picks: experts linear gemm attention, default all)
  mic() { case " ${MICRO:-experts linear gemm attention} " in *" $1 "*) return 0 ;; esac; return 1; }
  if mic experts; then timeout 60 .gpu/gputests/test_gpu_mma --bench-experts >$L/bench_experts.log 2>&1
    echo "== expert micro-benchmark:"; grep -vE "^ *$" $L/bench_experts.log | tail -24; fi
  if mic gemmexp; then timeout 120 .gpu/gputests/test_gpu_gemm --bench-experts >$L/bench_gemmexp.log 2>&1
    echo "== the routed experts' GEMM of an 8K step:"; tail -5 $L/bench_gemmexp.log; fi
  if mic gemm; then timeout 90 .gpu/gputests/test_gpu_gemm --bench >$L/bench_gemm.log 2>&1
    echo "== GEMM micro-benchmark:"; tail -16 $L/bench_gemm.log; fi
  if mic linear; then timeout 150 .gpu/gputests/test_gpu_mma --bench >$L/bench_linear.log 2>&1
    echo "== FP8 / FP4 linears at 1 and 8 tokens (streamed, small tiles, L2-hot):"; sed -n 2p $L/bench_linear.log
    grep -E "^FP[48] +[0-9]+x[0-9]+ +[18] " $L/bench_linear.log; fi
  if mic attention; then timeout 90 .gpu/gputests/test_gpu_attention --bench >$L/bench_attention.log 2>&1
    echo "== attention at decode (k_att_scores vs k_att_scores_dec vs k_att_dec; tensor cores: three kernels vs k_att_dec_mma):"
    grep -vE "^ *$" $L/bench_attention.log | tail -36; fi
fi
save
if has sansuite; then   # compute-sanitizer over whole GPU test programs (a barrier or race in any kernel the suite runs)
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in ${SANSUITE_TOOLS:-synccheck}; do
    for t in ${SANSUITE_TESTS:-$(cd .gpu/gputests && ls test_gpu_*)}; do
      env BUILD=.gpu ${SANSUITE_ENV:-} timeout ${SANSUITE_TIMEOUT:-60} $SAN --tool $tool --error-exitcode 9 .gpu/gputests/$t >$L/sansuite_${tool}_$t.log 2>&1
      echo "== $tool $t: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/sansuite_${tool}_$t.log | tr '\n' ' ' | cut -c1-160)"
      grep -m3 -E "^========= .*(Barrier|barrier|Race|race|Invalid)" $L/sansuite_${tool}_$t.log
    done
  done
fi
save
if has san; then   # compute-sanitizer (SAN_TOOL, default memcheck) over test_gpu_mma's tests matching SAN_TESTS
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for t in ${SAN_TESTS:-experts_*}; do   # cmocka's filter takes one pattern: one run each
    MMA_TEST_ONLY="$t" timeout ${SAN_TIMEOUT:-120} $SAN --tool ${SAN_TOOL:-memcheck} .gpu/gputests/test_gpu_mma >$L/san_${t//\*/}.log 2>&1
    echo "== compute-sanitizer ${SAN_TOOL:-memcheck} on test_gpu_mma $t: exit $?"
    grep -E "ERROR SUMMARY|PASSED|FAILED|Error" $L/san_${t//\*/}.log | head -8
  done
fi
save
if has ncu; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
  timeout 90 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
      --csv --page raw --kernel-name "regex:^k_(?!fill|mma_frag_pack|nat_pack)" --launch-count 2200 \
      $FLASH --prompt 1 --decode 2 --no-bandwidth >$L/ncu.csv 2>/dev/null
  # (the load's packing kernels excluded: run 175's 1,600 launches were all k_mma_frag_pack) step 2: the second decode step
  python3 tools/gpu/ncu_summary.py $L/ncu.csv k_embed 2 >"$OUT/ncu.txt" 2>&1
  echo "== ncu:"; head -34 "$OUT/ncu.txt"
fi
save
if has ktrace; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64"   # libcupti
  # a libcupti elsewhere (a pip wheel of torch's, another CUDA): its folder too
  CUPTI=$(find / -xdev \( -name 'libcupti.so' -o -name 'libcupti.so.*' \) 2>/dev/null | head -1)
  echo "== libcupti: ${CUPTI:-none found}"
  [ -n "$CUPTI" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$CUPTI")"
  for g in 1 0; do
    DSV4_CUDA_GRAPHS=$g timeout ${KTRACE_TIMEOUT:-150} $FLASH --prompt 64 --decode 16 --no-bandwidth --kernel-trace ${KTRACE_ARGS:-} \
        --json "$OUT/ktrace_graphs$g.json" >$L/ktrace_$g.log 2>&1
    echo "== kernel trace, DSV4_CUDA_GRAPHS=$g: exit $?"; grep -E "^decode, 1|^kernel trace|^    k_|error" $L/ktrace_$g.log | head -36
  done
fi
save
if has kvab; then   # decode at prompt 256 with each KV format
  for kv in f32 bf16 fp8; do
    timeout 90 $FLASH --kv $kv --prompt 256 --decode 32 --no-bandwidth >$L/kvab_$kv.log 2>&1
    echo "  kv $kv: $(grep -E '^decode, 1 stream' $L/kvab_$kv.log | awk '{print $4, $5, $6, $7}')$(grep -m1 -i 'error' $L/kvab_$kv.log)"
  done
fi
save
if has ncukv; then   # one decode step's kernels with f32 and with fp8 KV (prompt 64): where fp8 KV's time goes
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
  for kv in ${NCUKV_KV:-f32 fp8}; do
    timeout 120 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
        --csv --page raw --kernel-name "regex:^k_(?!fill|mma_frag_pack|nat_pack)" --launch-count 2200 \
        $FLASH --kv $kv --prompt 1 --decode 2 --no-bandwidth >$L/ncu_$kv.csv 2>/dev/null
    python3 tools/gpu/ncu_summary.py $L/ncu_$kv.csv k_embed 2 >"$OUT/ncu_$kv.txt" 2>&1
    echo "== ncu, a one-token step, $kv KV:"; head -22 "$OUT/ncu_$kv.txt"
  done
fi
save
if has sass; then   # the SASS of the kernels named in SASS_FUN (cuobjdump, where the machine has it)
  CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
  if [ -n "$CUOBJ" ]; then "$CUOBJ" -sass .gpu/gputests/test_gpu_mma >$L/mma.sass 2>&1
    python3 - "$L/mma.sass" "${SASS_FUN:-k_mma_expert}" >"$OUT/sass.txt" <<'PY'
import sys, re
text = open(sys.argv[1]).read().split("Function : ")
keep = [f for f in text if any(k in f.split("\n")[0] for k in sys.argv[2].split(","))]
print("".join("Function : " + f for f in keep))
PY
    echo "== sass: $(grep -c '^Function' "$OUT/sass.txt") functions, $(wc -l <"$OUT/sass.txt") lines"
  else echo "== sass: no cuobjdump"; fi
fi
save
if has ncusrc; then   # per-SASS-instruction executions and stall samples of one launch of each kernel in NCU_SRC (regex:skip)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
  i=0
  for kr in ${NCU_SRC:-k_mma_expert:4}; do   # regex:skip[:options of NCU_SRC_PROG, '+' for a space; default --bench-experts]
    IFS=: read -r kn ks opt <<<"$kr"; i=$((i + 1)); opt=${opt//+/ }
    timeout 150 "$NCU" --clock-control none --cache-control none --kernel-name "regex:$kn" --launch-skip "$ks" --launch-count 1 \
        --section SourceCounters --section InstructionStats --section WarpStateStats -f -o /tmp/src$i \
        .gpu/gputests/${NCU_SRC_PROG:-test_gpu_mma} ${opt:---bench-experts} >$L/ncusrc$i.log 2>&1
    timeout 60 "$NCU" --import /tmp/src$i.ncu-rep --page source --csv --print-source sass >"$OUT/src$i.csv" 2>>$L/ncusrc$i.log
    timeout 60 "$NCU" --import /tmp/src$i.ncu-rep --page details >>"$OUT/src$i.txt" 2>>$L/ncusrc$i.log
    echo "== ncu source $kn: $(wc -l <"$OUT/src$i.csv") lines"
  done
fi
save
if has ncudeep; then   # why a kernel is slow, not only how slow (run 42: the experts' 1 TB/s)
  # on the kernels' micro-benchmarks (test_gpu_mma): under ncu's kernel replay the 156 GB synthetic Flash is
  # backed up to host memory for every pass, and the next process found the GPU still full (run 42)
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
  for kr in ${NCU_DEEP:-k_mma_expert:4:2:--bench-experts k_mma_linear:4:2:--bench}; do   # kernel regex:skip:count:test_gpu_mma option
    IFS=: read -r kn ks kc opt <<<"$kr"
    timeout 150 "$NCU" --clock-control none --cache-control none --kernel-name "regex:^$kn" --launch-skip "$ks" --launch-count "$kc" \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section SchedulerStats .gpu/gputests/${NCU_DEEP_PROG:-test_gpu_mma} $opt >>"$OUT/ncu_deep.txt" 2>&1
  done
  echo "== ncu sections: $(grep -c 'Duration' "$OUT/ncu_deep.txt") launches in ncu_deep.txt"
fi
save
if has gemmab; then   # 8K prefill with DSV4_CUDA_GEMM = each of GEMMAB_KINDS (default 1 2), GEMMAB_ROUNDS alternating rounds; then
  # --profile with the last kind; then compute-sanitizer memcheck and racecheck over test_gpu_gemm (GEMMAB_SAN=0: not)
  for r in $(seq 1 ${GEMMAB_ROUNDS:-2}); do
    for g in ${GEMMAB_KINDS:-1 2}; do
      DSV4_CUDA_GEMM=$g timeout 90 $FLASH --prompt 8192 --decode 2 --no-bandwidth >$L/gemmab_${g}_$r.log 2>&1
      echo "== 8K prefill DSV4_CUDA_GEMM=$g round $r: $(grep -E '^prefill|rror' $L/gemmab_${g}_$r.log | head -2)"
    done
  done
  DSV4_CUDA_GEMM=$g timeout 90 $FLASH --prompt 8192 --decode 2 --no-bandwidth --profile >$L/gemmab_profile.log 2>&1
  echo "== profile, 8K prefill, DSV4_CUDA_GEMM=$g:"; sed -n '/per-stage time over/,/^prefill /p' $L/gemmab_profile.log | head -16
  if [ "${GEMMAB_SAN:-1}" = 1 ]; then
    for tool in memcheck racecheck; do
      timeout ${SAN_TIMEOUT:-240} compute-sanitizer --tool $tool --error-exitcode 9 .gpu/gputests/test_gpu_gemm >$L/san_gemm_$tool.log 2>&1
      echo "== compute-sanitizer $tool test_gpu_gemm: exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' $L/san_gemm_$tool.log | tr '\n' ' ' | cut -c1-300)"
    done
  fi
fi
save
if has profile; then
  timeout 90 $FLASH --prompt 8192 --decode 2 --no-bandwidth --profile >$L/profile_prefill.log 2>&1
  timeout 120 $FLASH --prompt 256 --decode 8 --no-bandwidth --streams 64 --profile >$L/profile_streams.log 2>&1
  DSV4_CUDA_GEMM=0 timeout 90 $FLASH --prompt 8192 --decode 2 --no-bandwidth >$L/prefill_nogemm.log 2>&1
  echo "== 8K prefill with DSV4_CUDA_GEMM=0: $(grep -E '^prefill' $L/prefill_nogemm.log)"
  echo "== profile, 8K prefill then decode:"; grep -vE "^(kv |model|synthetic|device)" $L/profile_prefill.log | head -60
  echo "== profile, 64 streams:"; sed -n '/per-stage time of/,$p' $L/profile_streams.log | head -30
fi
save
if has ncuatt; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
  timeout 240 "$NCU" --metrics gpu__time_duration.sum,launch__grid_size --csv --page raw --kernel-name "regex:^k_(att|index|spl)" \
      --launch-count 20000 $FLASH --prompt ${NCU_ATT_PROMPT:-8192} --decode 1 --no-bandwidth >$L/ncu_att.csv 2>$L/ncu_att.err
  python3 tools/gpu/ncu_summary.py $L/ncu_att.csv k_att all >"$OUT/ncu_att.txt" 2>&1
  echo "== ncu, attention and indexer kernels of a ${NCU_ATT_PROMPT:-8192}-token prefill:"; cat "$OUT/ncu_att.txt"; tail -3 $L/ncu_att.err
  timeout 200 "$NCU" --set full --kernel-name "regex:^k_att_" --launch-skip ${NCU_ATT_SKIP:-60} --launch-count ${NCU_ATT_COUNT:-3} \
      -o $OUT/ncu_att_full $FLASH --prompt ${NCU_ATT_PROMPT:-8192} --decode 1 --no-bandwidth >$L/ncu_att_full.log 2>&1
  "$NCU" -i $OUT/ncu_att_full.ncu-rep --page details --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section LaunchStats --section MemoryWorkloadAnalysis >$L/ncu_att_full.txt 2>&1
  echo "== ncu sections:"; grep -E "^  k_att|Duration|Compute \(SM\) Thr|Memory Thr|DRAM Thr|Achieved Occ|Registers Per|Grid Size|Block Size|Issue Slots|Stall|L1/TEX Hit|L2 Hit|Warp Cycles Per Issued" $L/ncu_att_full.txt | head -60
fi
save
if has pfab; then
  pf() { timeout 120 .gpu/$1 bench --synthetic flash --device cuda --mode official --prompt ${PFAB_PROMPT:-8192} \
      --prefill-chunk ${PFAB_CHUNK:-8192} --decode 2 --no-bandwidth ${PFAB_ARGS:-} $2 >$L/pfab_$1_$3.log 2>&1; }
  echo "== prefill A/B (${PFAB_PROMPT:-8192} tokens):"
  for r in $(seq 1 "${PFAB_ROUNDS:-2}"); do
    for v in dsv4 ${VARIANTS:-}; do
      [ -x .gpu/$v ] || { echo "  $v: missing"; continue; }
      pf $v "" $r; echo "  round $r $v: $(grep -E '^prefill' $L/pfab_${v}_$r.log | awk '{print $2, $3}')$(grep -m1 -i 'error' $L/pfab_${v}_$r.log)"
    done
  done
  for v in dsv4 ${VARIANTS:-}; do
    [ -x .gpu/$v ] || continue
    pf $v --profile p; echo "  profile $v: $(grep -E '^  (indexer|attention|routed experts) ' $L/pfab_${v}_p.log | tr -s ' ' | tr '\n' ';')"
  done
fi
save
if has sab; then   # decode of SAB_STREAMS streams (default 8,64,256), SAB_ROUNDS alternating rounds: dsv4 and each binary of VARIANTS
  echo "== A/B, streams (prompt 64; tok/s, rounds alternate):"
  for r in $(seq 1 "${SAB_ROUNDS:-1}"); do
    for v in dsv4 ${VARIANTS:-}; do
      [ -x .gpu/$v ] || { echo "  $v: missing"; continue; }
      timeout 150 .gpu/$v bench --synthetic flash --device cuda --mode official --prompt 64 --decode 16 --no-bandwidth \
          --streams ${SAB_STREAMS:-8,64,256} >$L/sab_${v}_$r.log 2>&1
      echo "  round $r $v: 1 stream $(grep -E '^decode, 1 stream' $L/sab_${v}_$r.log | awk '{print $4}');" \
          "$(grep -E '^ +[0-9]+ +[0-9.]+ ' $L/sab_${v}_$r.log | awk '{printf "%s: %s  ", $1, $2}')$(grep -m1 -i 'error' $L/sab_${v}_$r.log)"
    done
  done
fi
save
if has sprof; then
  for n in ${SPROF_STREAMS:-32 256}; do
    timeout 150 $FLASH --prompt 64 --decode 8 --no-bandwidth --streams $n --profile >$L/sprof_$n.log 2>&1
    echo "== $n streams, exit $?:"; grep -E "^ +$n " $L/sprof_$n.log; sed -n '/per-stage time of/,$p' $L/sprof_$n.log | head -16
  done
fi
save
if has long; then   # a long prompt prefilled in chunks, as the scheduler does: the rate and where its time goes
  for v in ${LONG_RUNS:-default}; do   # LONG_RUNS: "default" and / or NAME=V(+NAME2=V2) entries, one run each
    e=; [ "$v" = default ] || e=${v//+/ }
    env $e timeout ${LONG_TIMEOUT:-400} $FLASH --prompt ${LONG_PROMPT:-131072} --prefill-chunk ${LONG_CHUNK:-8192} \
        --decode 2 --no-bandwidth --profile >$L/long_${v//[=+]/_}.log 2>&1
    echo "== long prefill, $v: exit $?"; grep -vE "^(kv |model|synthetic|device)" $L/long_${v//[=+]/_}.log | head -50
  done
fi
save
if has bus; then
  echo "== Flash --gpu-mem ${BUS_MEM:-80}, bus shares ${BUS_SHARES:-0 0.5}:"
  for b in ${BUS_SHARES:-0 0.5}; do   # an entry tF: --bus-share F --bus-by-token (issue 15's token split)
    t0=$(date +%s) share=$b by=
    case $b in t*) share=${b#t} by=--bus-by-token ;; esac
    timeout ${BUS_TIMEOUT:-200} $FLASH --gpu-mem ${BUS_MEM:-80} --bus-share $share $by --prompt 64 --decode 16 --no-bandwidth ${BUS_ARGS:-} \
        >$L/bus_$b.log 2>&1
    rc=$?
    echo "  --bus-share $share $by (exit $rc, $(( $(date +%s) - t0 )) s): $(grep -E '^prefill|^decode, 1' $L/bus_$b.log | head -2 | tr '\n' ' ' | tr -s ' ')"
    echo "    $(grep -E 'in host memory|^host, a decode|^host expert reads|error' $L/bus_$b.log | tail -4 | tr '\n' ' ' | tr -s ' ' | cut -c 1-600)"
  done
fi
save
if has ahead; then   # issue 15: steps with host experts enqueued ahead (DSV4_CUDA_HX_AHEAD) against launched directly
  # an 80 GB card (H100) holds less than --gpu-mem 80 of the bench's model: 72 there
  if [ -z "${AHEAD_MEM:-}" ] && [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ]; then
    AHEAD_MEM=72
  fi
  # an entry: [BIN:]A[tN] — the staged binary .gpu/BIN (default dsv4), DSV4_CUDA_HX_AHEAD=A, tN: --threads N
  i=0
  for e in ${AHEAD_RUNS:-1 0}; do
    i=$((i + 1)) t0=$(date +%s)
    bin=dsv4 a=$e; case $e in *:*) bin=${e%%:*} a=${e#*:} ;; esac
    thr=; case $a in *t*) thr="--threads ${a#*t}" ;; esac
    DSV4_CUDA_HX_AHEAD=${a:0:1} timeout ${AHEAD_TIMEOUT:-200} .gpu/$bin bench --synthetic flash --device cuda --mode official \
        --gpu-mem ${AHEAD_MEM:-80} --prompt 64 --decode 16 --no-bandwidth $thr ${AHEAD_ARGS:-} >$L/ahead_${i}.log 2>&1
    rc=$?
    echo "== $bin --gpu-mem ${AHEAD_MEM:-80}, DSV4_CUDA_HX_AHEAD=${a:0:1} $thr (exit $rc, $(( $(date +%s) - t0 )) s): $(grep -E '^prefill|^decode, 1' $L/ahead_${i}.log | head -2 | tr '\n' ' ' | tr -s ' ')"
    grep -E "^host, a decode|^host expert reads|^decode, CPU|^speculative verify step|error" $L/ahead_${i}.log | head -5 | cut -c 1-240
  done
fi
save
if has aheadtrace; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64"
  CUPTI=$(find / -xdev \( -name 'libcupti.so' -o -name 'libcupti.so.*' \) 2>/dev/null | head -1)
  [ -n "$CUPTI" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$CUPTI")"
  if [ -z "${AHEAD_MEM:-}" ] && [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ]; then
    AHEAD_MEM=72
  fi
  # an entry: [BIN:]A[g0][p0] — the staged binary .gpu/BIN (default dsv4), DSV4_CUDA_HX_AHEAD=A; g0: graphs off
  # (launched directly), p0: plain graph edges
  for e in ${AHEAD_RUNS:-0 1 1g0 1p0}; do
    bin=dsv4 a=$e; case $e in *:*) bin=${e%%:*} a=${e#*:} ;; esac
    g=1; case $a in *g0*) g=0 ;; esac
    p=2; case $a in *p0*) p=0 ;; esac
    n=${bin#dsv4}; n=${n#-}; n=${n:+${n}_}$a
    DSV4_CUDA_HX_AHEAD=${a:0:1} DSV4_CUDA_GRAPHS=$g DSV4_CUDA_PDL=$p timeout ${AHEAD_TIMEOUT:-200} .gpu/$bin bench --synthetic flash \
        --device cuda --mode official --gpu-mem ${AHEAD_MEM:-80} --prompt 64 --decode 16 \
        --warmup ${AHEAD_ARGS:-} --no-bandwidth --kernel-trace --json "$OUT/aheadtrace_$n.json" >$L/aheadtrace_$n.log 2>&1
    echo "== $bin, kernel trace, --gpu-mem ${AHEAD_MEM:-80}, DSV4_CUDA_HX_AHEAD=${a:0:1} DSV4_CUDA_GRAPHS=$g DSV4_CUDA_PDL=$p: exit $?"
    grep -E "^prefill|^decode, 1|^speculative verify|^experts in host|^kernel trace|^    k_|^host|thread pool|error" $L/aheadtrace_$n.log |
      grep -v "^    k_" | head -24
  done
  echo "== between hand-offs (tools/gpu/trace_gaps.py):"; python3 tools/gpu/trace_gaps.py "$OUT"/aheadtrace_*.json
fi
save
if has link && [ -x .gpu/hx_link_bench ]; then
  echo "== the host link's round trip (hx_link_bench):"; timeout ${LINK_TIMEOUT:-120} .gpu/hx_link_bench ${LINK_ROUNDS:-2000} 2>&1 | tee $L/link.log
fi
save
if has skew; then
  python3 -c "
import random; random.seed(5)
for i in range(16): print(','.join(str(random.randrange(1000, 129000)) for _ in range(128)))" >$L/skew_prompts.txt
  skew_bench() {   # $1 = S, $2 = --gpu-mem, $3 = log name, rest: more bench arguments
    local s=$1 g=$2 n=$3; shift 3
    local sk=; [ "$s" = 0 ] || sk="--route-skew $s"
    t0=$(date +%s)
    timeout ${SKEW_TIMEOUT:-200} $FLASH $sk --gpu-mem $g --prompt 64 --decode 16 --no-bandwidth "$@" >$L/$n.log 2>&1
    echo "  $n (exit $?, $(( $(date +%s) - t0 )) s): $(grep -E '^prefill|^decode, 1|^decode routes|^experts in host' $L/$n.log | tr '\n' ' ' | tr -s ' ' | cut -c 1-800)"
  }
  for s in ${SKEWS:-0.1}; do
    d=/tmp/dsv4-synthetic-flash; [ "$s" = 0 ] || d=$d-skew$s
    echo "== skew $s ($d):"
    rm -f $d/expert_profile.json
    [ "${SKEW_EVEN:-1}" = 0 ] || skew_bench $s ${SKEW_BASE_MEM:-80} skew_${s}_even --expert-profile ""
    if [ -f .gpu/profiles/skew_${s}_profile.json ]; then   # an earlier run's profile (the same prompts and model)
      mkdir -p $d && cp .gpu/profiles/skew_${s}_profile.json $d/expert_profile.json   # the bench writes the model around it
      echo "  profile: .gpu/profiles/skew_${s}_profile.json"
    else
      t0=$(date +%s)
      timeout ${SKEW_TIMEOUT:-200} .gpu/dsv4 profile -m $d --device cuda --mode official --gpu-mem 132 --file $L/skew_prompts.txt \
          >$L/skew_${s}_profile.log 2>&1
      echo "  profile (exit $?, $(( $(date +%s) - t0 )) s): $(grep -E 'profile:|rror' $L/skew_${s}_profile.log | cut -c 1-300)"
    fi
    cp $d/expert_profile.json $L/skew_${s}_profile.json 2>/dev/null
    for g in ${SKEW_MEMS:-132 80 24}; do
      skew_bench $s $g skew_${s}_prof_$g
    done
  done
fi
save
if has cpuflash; then
  timeout ${CPUFLASH_TIMEOUT:-240} .gpu/dsv4 bench --synthetic flash --mode official ${CPUFLASH_ARGS:---prompt 16 --decode 16} >$L/cpuflash.log 2>&1
  echo "== cpuflash (all CPU): exit $?: $(grep -E '^synthetic|^memory read|^prefill|^decode, 1|^decode weight|^decode, CPU' $L/cpuflash.log | cut -c 1-200 | tr '\n' '|')"
  timeout ${CPUFLASH_TIMEOUT:-240} $FLASH --gpu-mem ${GPU_MEM_CPU:-24} ${CPUFLASH_ARGS:---prompt 16 --decode 16} >$L/cpuflash_gpu.log 2>&1
  echo "== the same, --gpu-mem ${GPU_MEM_CPU:-24}: exit $?: $(grep -E '^host memory|^prefill|^decode, 1|^decode routes|^experts in host|^host expert' $L/cpuflash_gpu.log | cut -c 1-200 | tr '\n' '|')"
fi
save
if has final; then
  timeout 200 $FLASH --prompt 256 --decode 48 --streams 8,32,64,128,256 --json $L/flash.json >$L/flash.log 2>&1
  timeout 80 $FLASH --prompt 8192 --decode 2 --no-bandwidth >$L/prefill.log 2>&1
  timeout 110 $FLASH --kv fp8 --prompt 64 --decode 8 --no-bandwidth --context 4096,131072,1048576 >$L/context.log 2>&1
  echo "== flash:"; grep -E "bandwidth|prefill|decode|fraction|verify|graphs|^ +(8|32|64|128|256) |rror" $L/flash.log
  echo "== prefill 8K:"; grep -E "prefill|rror" $L/prefill.log
  echo "== context:"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+|rror" $L/context.log
fi
save
if [ -n "${FUZZ_SECONDS:-}" ]; then echo "== fuzz:"; OUT="$OUT" tools/gpu/fuzz_bg.sh stop | tail -12; fi
tar -C /tmp -czf "$OUT/logs.tgz" run-logs
echo "total $(el) s; files in \$OUT: $(ls $OUT | wc -l)"
