#!/usr/bin/env bash
# dsv4 vs llama.cpp on the CPU, the same weights, back to back (issue 17's comparison, reproducible).
#
# What it does, each step skipped when its output exists:
#   1. ik_llama.cpp (the CPU-focused llama.cpp fork with DeepSeek V4 support) extracted from a bare git mirror into
#      $IK_DIR, OUTSIDE this repository (third-party code never enters dsv4), and built CPU-only: cmake Release,
#      -DGGML_NATIVE=ON, -DGGML_CUDA=OFF, target libllama only, -j$JOBS; plus our driver tools/bench/llamacpp_run.cpp
#      linked against it (token ids in, logits out; and llama-bench's timing method step for step: llama-bench
#      itself needs the `common` library, ~an hour more of compiling on a shared 2-core box; set LLAMA_BENCH=1 to
#      build and run it as well).
#   2. the flash-2g synthetic checkpoint (V4-Flash's structure at hidden 2048, 8 layers, 64 experts, official
#      format: FP8 linears, FP4 experts) written by `dsv4 bench --synthetic flash-2g` to /tmp.
#   3. the GGUF by tools/bench/v4_to_gguf.py (numpy only): FP8 -> Q8_0, FP4 -> MXFP4 (lossless repack), BF16 kept.
#   4. a correctness check: the same 16 token ids through `dsv4 logits` (exact and official modes) and through
#      llamacpp_run check; per-position argmax agreement, logit correlation, and 8 greedy tokens of each.
#   5. bytes read per decoded token for the GGUF (non-expert tensors + one embedding row + 6/64 of each routed
#      expert tensor, dsv4's own rule) next to the count dsv4 bench prints.
#   6. $ROUNDS alternating rounds: dsv4 bench official, dsv4 bench exact, llamacpp_run bench with each of
#      $LB_CONFIGS (flash attention, fused MoE, run-time repack); 128-token prefill (one batch) and decode (32 tokens
#      after the 128-token prompt, llama-bench's -gp 128,32) at $THREADS threads, best of 3 reps per run; then a table of best-of-rounds (and the spread) and the ratios against the targets
#      (decode >= 1.3x llama.cpp, prefill >= 1.5x).
#
# Usage (from the repository root, after `make`):
#   tools/bench/llamacpp_compare.sh                 # everything, 3 rounds
#   ROUNDS=5 THREADS=2 tools/bench/llamacpp_compare.sh
#   SKIP_CHECK=1 tools/bench/llamacpp_compare.sh    # timings only
# Environment: IK_MIRROR (bare git dir, default /work/.mirror/ikawrakow+ik_llama.cpp/repo), IK_DIR (default
# /work/ikllama), DATA (GGUF and logs, default /work/llamacpp-data), PYTHON (with numpy, default /usr/bin/python3),
# LB_CONFIGS (space-separated FA:FMOE:RTR triples, default "1:1:0 1:1:1 1:0:0"; FA=0 aborts in ik_llama.cpp's
# DeepSeek V4 graph at this commit: GGML_ASSERT(i1 >= 0 && i1 < ne1) in set_rows on the first decode step).
# Needs: cmake, g++, python3 with numpy, ~2.4 GB in /tmp and ~2.4 GB in $DATA.
# Run it on a quiet machine: ik_llama.cpp's CPU backend runs each graph in an OpenMP region with spinning barriers,
# and with other work on the cores its decode collapses (measured here: 0.5-6 tok/s against 24 when quiet, 69 % of
# its samples in libgomp's spin), far more than dsv4's (whose pool yields); numbers from a busy box say little.
# The last column of the table is the idle share just before each run; QUIET_WAIT / QUIET_IDLE tune the wait.
set -euo pipefail
cd "${DSV4_ROOT:-$(dirname "$0")/../..}"  # DSV4_ROOT: when run from a copy (bash reads a script as it runs: editing it mid-run breaks the run)
ROOT=$PWD
IK_MIRROR=${IK_MIRROR:-/work/.mirror/ikawrakow+ik_llama.cpp/repo}
IK_DIR=${IK_DIR:-/work/ikllama}
DATA=${DATA:-/work/llamacpp-data}
PYTHON=${PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
JOBS=${JOBS:-2}
LB_CONFIGS=${LB_CONFIGS:-"1:1:0 1:1:1 1:0:0"}
CKPT=/tmp/dsv4-synthetic-flash-2g
GGUF=$DATA/flash-2g.gguf
DSV4=$ROOT/build/dsv4
mkdir -p "$DATA"
# The box may be shared: before each timed run wait (up to $QUIET_WAIT s) until the CPUs were >= $QUIET_IDLE % idle
# over one second, and record the idle share seen (the table's last column), so best-of-rounds means quiet runs.
QUIET_WAIT=${QUIET_WAIT:-120}
QUIET_IDLE=${QUIET_IDLE:-90}
idle_pct() {
    local a b
    a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
    local tot=0 i
    for i in 1 2 3 4 5 6 7 8; do tot=$((tot + b[i] - a[i])); done
    echo $(( tot > 0 ? 100 * (b[4] - a[4] + b[5] - a[5]) / tot : 0 ))
}
wait_quiet() {
    local t0=$SECONDS p
    while :; do
        p=$(idle_pct)
        if [ "$p" -ge "$QUIET_IDLE" ] || [ $((SECONDS - t0)) -ge "$QUIET_WAIT" ]; then echo "$p"; return; fi
    done
}
log() { printf '[compare %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# ---- 1. ik_llama.cpp
case "$IK_DIR" in "$ROOT"/*) echo "IK_DIR must lie outside the repository" >&2; exit 1;; esac
if [ ! -f "$IK_DIR/CMakeLists.txt" ]; then
    log "extracting ik_llama.cpp from $IK_MIRROR into $IK_DIR"
    mkdir -p "$IK_DIR"
    # checkout-index, not git archive: a partial mirror may lack a few large blobs (web UI, vocab test files),
    # which archive refuses and checkout-index skips with a warning
    idx=$(mktemp -d)
    GIT_DIR=$IK_MIRROR GIT_INDEX_FILE=$idx/index git read-tree HEAD
    GIT_DIR=$IK_MIRROR GIT_INDEX_FILE=$idx/index git checkout-index -a --prefix="$IK_DIR/" 2>/dev/null || true
    rm -rf "$idx"
    git --git-dir="$IK_MIRROR" rev-parse HEAD > "$IK_DIR/.commit"
fi
TARGETS=llama
[ -n "${LLAMA_BENCH:-}" ] && TARGETS="llama llama-bench"
if [ ! -e "$IK_DIR/build/src/libllama.so" ] || { [ -n "${LLAMA_BENCH:-}" ] && [ ! -x "$IK_DIR/build/bin/llama-bench" ]; }; then
    log "building ik_llama.cpp ($TARGETS; CPU only, -j$JOBS; long on 2 cores)"
    cmake -S "$IK_DIR" -B "$IK_DIR/build" -DGGML_CUDA=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
          -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF > "$DATA/ik_cmake.log"
    cmake --build "$IK_DIR/build" -j"$JOBS" --target $TARGETS > "$DATA/ik_build.log" 2>&1
fi
RUN_BIN=$IK_DIR/build/bin/llamacpp_run
if [ ! -x "$RUN_BIN" ] || [ tools/bench/llamacpp_run.cpp -nt "$RUN_BIN" ]; then
    log "building llamacpp_run"
    mkdir -p "$IK_DIR/build/bin"
    g++ -O2 -std=c++17 -I"$IK_DIR/include" -I"$IK_DIR/ggml/include" tools/bench/llamacpp_run.cpp \
        -L"$IK_DIR/build/src" -L"$IK_DIR/build/ggml/src" -lllama -lggml -Wl,-rpath,"$IK_DIR/build/src:$IK_DIR/build/ggml/src" \
        -lpthread -o "$RUN_BIN"
fi
IK_COMMIT=$(cat "$IK_DIR/.commit" 2>/dev/null || git --git-dir="$IK_MIRROR" rev-parse HEAD)

# ---- 2. dsv4 and the checkpoint
[ -x "$DSV4" ] || make -j"$JOBS" build/dsv4
if [ ! -f "$CKPT/model.safetensors.index.json" ]; then
    log "writing the flash-2g checkpoint (a short bench run)"
    "$DSV4" bench --synthetic flash-2g --prompt 4 --decode 1 --no-bandwidth --threads "$THREADS" > /dev/null
fi

# ---- 3. the GGUF
if [ ! -f "$GGUF" ] || [ "$CKPT/config.json" -nt "$GGUF" ]; then
    log "converting to $GGUF"
    "$PYTHON" tools/bench/v4_to_gguf.py --gguf-py "$IK_DIR/gguf-py" "$CKPT" "$GGUF.tmp"
    mv "$GGUF.tmp" "$GGUF"
fi

# ---- 4. correctness: same ids, both engines
if [ -z "${SKIP_CHECK:-}" ]; then
    IDS=$("$PYTHON" -c "import random; r=random.Random(17); print(','.join(str(r.randrange(2,32768)) for _ in range(16)))")
    log "correctness check on 16 token ids"
    for mode in exact official; do
        "$DSV4" logits -m "$CKPT" --tokens "$IDS" --out "$DATA/dsv4_$mode.npy" --mode "$mode" --threads "$THREADS" > /dev/null 2>&1
        "$DSV4" generate -m "$CKPT" --tokens "$IDS" -n 8 --mode "$mode" --threads "$THREADS" 2>/dev/null | tr ',' ' ' > "$DATA/dsv4_$mode.greedy"
    done
    "$RUN_BIN" check "$GGUF" "$IDS" "$DATA/llamacpp.npy" 8 "$THREADS" 1 > "$DATA/llamacpp.check" 2> "$DATA/llamacpp.check.log"
    grep -E "n_layer|n_expert|n_expert_used|type +[a-z0-9_]+:" "$DATA/llamacpp.check.log" | sed 's/^/  llama.cpp load: /' || true
    "$PYTHON" - "$DATA" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
ll = np.load(f"{d}/llamacpp.npy")
lg = open(f"{d}/llamacpp.check").read().split("greedy:")[1].split()
ref = {m: np.load(f"{d}/dsv4_{m}.npy") for m in ("exact", "official")}
print(f"correctness (16 positions, vocab {ll.shape[1]}):")
pairs = [("dsv4 exact", ref["exact"], "dsv4 official", ref["official"]),
         ("dsv4 exact", ref["exact"], "llama.cpp", ll), ("dsv4 official", ref["official"], "llama.cpp", ll)]
for na, a, nb, b in pairs:
    agree = int((a.argmax(1) == b.argmax(1)).sum())
    corr = [np.corrcoef(a[i], b[i])[0, 1] for i in range(a.shape[0])]
    print(f"  {na:14s} vs {nb:13s}: argmax equal at {agree:2d}/16 positions, logit correlation "
          f"min {min(corr):.4f} mean {np.mean(corr):.4f}, max |diff| {np.abs(a - b).max():.3f}")
for m in ("exact", "official"):
    print(f"  greedy 8, dsv4 {m:8s}: {open(f'{d}/dsv4_{m}.greedy').read().split()}")
print(f"  greedy 8, llama.cpp     : {lg}")
EOF
fi

# ---- 5. bytes per decoded token of the GGUF
"$PYTHON" - "$IK_DIR/gguf-py" "$GGUF" <<'EOF' | tee "$DATA/gguf_bytes.txt"
import sys; sys.path.insert(0, sys.argv[1])
import gguf
from collections import Counter
r = gguf.GGUFReader(sys.argv[2])
n_used = int(r.fields["deepseek4.expert_used_count"].parts[-1][0]); n_exp = int(r.fields["deepseek4.expert_count"].parts[-1][0])
fixed = routed = total = 0; types = Counter()
for t in r.tensors:
    total += t.n_bytes; types[t.tensor_type.name] += t.n_bytes
    if t.name == "token_embd.weight" or "tid2eid" in t.name:   # one row per token
        fixed += t.n_bytes // int(t.shape[-1])
    elif "_exps." in t.name:
        routed += t.n_bytes * n_used // n_exp
    else:
        fixed += t.n_bytes
print(f"gguf: {total/1e9:.3f} GB, {(fixed+routed)/1e9:.3f} GB read per decoded token "
      f"({fixed/1e9:.3f} non-expert + {routed/1e9:.3f} routed, {n_used} of {n_exp}); by type: " +
      ", ".join(f"{k} {v/1e9:.3f} GB" for k, v in types.most_common()))
EOF

# ---- 6. alternating rounds
RES=$DATA/rounds.tsv
: > "$RES"
for r in $(seq 1 "$ROUNDS"); do
    for mode in official exact; do
        log "round $r: dsv4 $mode"
        load=$(wait_quiet)
        # --warmup: an untimed prefill first (llamacpp_run, like llama-bench, warms up and then keeps the best of 3 reps)
        out=$("$DSV4" bench --synthetic flash-2g --mode "$mode" --prompt 128 --decode 32 --warmup --threads "$THREADS" 2>&1)
        echo "$out" > "$DATA/dsv4_${mode}_r$r.log"
        pf=$(echo "$out" | awk '/^prefill /{print $2}')
        dc=$(echo "$out" | awk '/^decode, 1 stream/{print $4}')
        bw=$(echo "$out" | awk '/^memory read bandwidth/{print $4}')
        gb=$(echo "$out" | awk '/^decode weight traffic/{print $6}')
        printf 'dsv4 %s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$r" "$pf" "$dc" "$bw" "$gb" "$load" >> "$RES"
    done
    for cfg in $LB_CONFIGS; do
        IFS=: read -r fa fmoe rtr <<< "$cfg"
        name="llama.cpp fa=$fa fmoe=$fmoe rtr=$rtr"
        log "round $r: $name"
        load=$(wait_quiet)
        tag="fa${fa}_fmoe${fmoe}_rtr${rtr}_r$r"
        "$RUN_BIN" bench "$GGUF" 128 32 3 "$THREADS" "$fa" "$fmoe" "$rtr" > "$DATA/ll_$tag.out" 2> "$DATA/ll_$tag.log" \
            || { log "llamacpp_run bench failed: see $DATA/ll_$tag.log"; continue; }
        pf=$(awk '$3=="pp"{if($4>m)m=$4} END{print m}' "$DATA/ll_$tag.out")
        dc=$(awk '$5=="tg"{if($6>m)m=$6} END{print m}' "$DATA/ll_$tag.out")
        printf '%s\t%s\t%s\t%s\t-\t-\t%s\n' "$name" "$r" "$pf" "$dc" "$load" >> "$RES"
    done
    if [ -n "${LLAMA_BENCH:-}" ]; then
        log "round $r: llama-bench"
        load=$(wait_quiet)
        "$IK_DIR/build/bin/llama-bench" -m "$GGUF" -t "$THREADS" -p 128 -n 0 -gp 128,32 -r 3 -o csv \
            > "$DATA/lb_r$r.csv" 2> "$DATA/lb_r$r.log" || log "llama-bench failed: see $DATA/lb_r$r.log"
        pf=$("$PYTHON" -c "import csv,sys; rows=list(csv.DictReader(open(sys.argv[1]))); print([r['avg_ts'] for r in rows if r['n_gen']=='0'][0])" "$DATA/lb_r$r.csv" || echo 0)
        dc=$("$PYTHON" -c "import csv,sys; rows=list(csv.DictReader(open(sys.argv[1]))); print([r['avg_ts'] for r in rows if r['n_gen']=='32'][0])" "$DATA/lb_r$r.csv" || echo 0)
        printf 'llama.cpp llama-bench\t%s\t%s\t%s\t-\t-\t%s\n' "$r" "$pf" "$dc" "$load" >> "$RES"
    fi
done

"$PYTHON" - "$RES" "$THREADS" "$IK_COMMIT" <<'EOF'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = {}
for row in rows:
    name, r, pf, dc, bw, gb = row[:6]
    if not pf or not dc: continue
    e = by.setdefault(name, {"pf": [], "dc": [], "bw": [], "gb": gb, "load": []})
    if len(row) > 6: e["load"].append(row[6])
    e["pf"].append(float(pf)); e["dc"].append(float(dc))
    if bw != "-": e["bw"].append(float(bw))
def cell(v): return f"{max(v):6.1f} ({min(v):5.1f}-{max(v):5.1f})"
print(f"\n{len(rows)} runs, {sys.argv[2]} threads, ik_llama.cpp {sys.argv[3][:12]}; best of rounds (min-max):")
print(f"{'engine':28s} {'prefill 128 tok/s':>22s} {'decode tok/s':>22s}  idle % before each run")
for k, e in by.items():
    print(f"{k:28s} {cell(e['pf']):>22s} {cell(e['dc']):>22s}  {' '.join(e['load'])}")
ll = {k: e for k, e in by.items() if k.startswith("llama.cpp")}
if ll:
    best_pf = max(max(e["pf"]) for e in ll.values()); best_dc = max(max(e["dc"]) for e in ll.values())
    print(f"\nllama.cpp best: prefill {best_pf:.1f}, decode {best_dc:.1f} tok/s")
    for k, e in by.items():
        if k.startswith("dsv4"):
            bwtxt = f"; read bandwidth {max(e['bw']):.1f} GB/s, decode at {float(e['gb']) * max(e['dc']) / max(e['bw']) * 100:.0f}% of it" if e["bw"] else ""
            print(f"{k}: prefill {max(e['pf']) / best_pf:.2f}x (target 1.5x), decode {max(e['dc']) / best_dc:.2f}x (target 1.3x){bwtxt}")
EOF
