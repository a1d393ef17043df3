#!/usr/bin/env bash
# The command line on the GPU (--device cuda): logits are bit-identical across --chunks and --batch on the GPU;
# a state saved by a GPU run resumes on the CPU and the other way round; greedy generate gives the same ids with
# --spec none / ngram / self / mtp / dspark and in --batch (the engine above dsv4_step does not care which device
# holds a sequence); bad input gives one clean line; bench runs. Without a GPU: one line, and passes.
. "$(dirname "$0")/../cli/lib.sh"

"$BIN" tiny -o "$T/probe" >/dev/null 2>&1
if ! "$BIN" logits -m "$T/probe" --tokens 1 --device cuda >/dev/null 2>"$T/err"; then
    echo "gpu cli: skipped, needs a GPU: $(cat "$T/err")"; echo "0 passed, 0 failed"; exit 0
fi

"$BIN" tiny -o "$T/m" --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 \
    --set index_topk=3 >/dev/null 2>&1 || { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }
TOK=$(seq -s, 3 2 400)
for mode in exact official; do
    for kv in f32 fp8; do
        expect_ok "logits $mode $kv" "$BIN" logits -m "$T/m" --device cuda --mode $mode --kv $kv --tokens "$TOK" --out "$T/a.npy"
        expect_ok "logits chunks" "$BIN" logits -m "$T/m" --device cuda --mode $mode --kv $kv --tokens "$TOK" --chunks 3,50,1,7,64 --out "$T/b.npy"
        cmp -s "$T/a.npy" "$T/b.npy" && ok || bad "$mode $kv: --chunks logits differ from one call on the GPU"
        # save on the GPU at 130, resume on the CPU; save on the CPU, resume on the GPU
        expect_ok "save on gpu" "$BIN" logits -m "$T/m" --device cuda --mode $mode --kv $kv --tokens "$TOK" --save-at 130 --state "$T/s1"
        expect_ok "resume on cpu" "$BIN" logits -m "$T/m" --device cpu --mode $mode --kv $kv --tokens "$TOK" --resume "$T/s1" --out "$T/c.npy"
        expect_ok "save on cpu" "$BIN" logits -m "$T/m" --device cpu --mode $mode --kv $kv --tokens "$TOK" --save-at 130 --state "$T/s2"
        expect_ok "resume on gpu" "$BIN" logits -m "$T/m" --device cuda --mode $mode --kv $kv --tokens "$TOK" --resume "$T/s2" --out "$T/d.npy"
        expect_ok "state inspect" "$BIN" state inspect "$T/s1"
    done
done
{ echo "7"; echo "1,2,3,4,5,6,7,8,9,10,11,12"; seq -s, 10 150; echo "3,3,3,3,3,3"; } >"$T/prompts"
expect_ok "logits batch" "$BIN" logits -m "$T/m" --device cuda --batch "$T/prompts" --out "$T/batch"
for i in 0 1 2 3; do
    "$BIN" logits -m "$T/m" --device cuda --tokens "$(sed -n "$((i + 1))p" "$T/prompts")" --out "$T/alone.npy" 2>/dev/null
    cmp -s "$T/batch.$i.npy" "$T/alone.npy" && ok || bad "--batch line $i differs from the stream alone on the GPU"
done

P=5,9,100,7,5,9,100,7,5,9
"$BIN" generate -m "$T/m" --device cuda --tokens $P --ids -n 150 >"$T/ref" 2>/dev/null || bad "plain generate on cuda failed"
for s in ngram self; do
    "$BIN" generate -m "$T/m" --device cuda --tokens $P --ids -n 150 --spec $s --draft 5 >"$T/out" 2>"$T/err" &&
        cmp -s "$T/ref" "$T/out" && ok || bad "cuda --spec $s: ids differ from --spec none: $(cat "$T/err")"
done
"$BIN" generate -m "$T/m" --device cuda --batch "$T/prompts" -n 60 >"$T/bref" 2>/dev/null || bad "cuda --batch failed"
"$BIN" generate -m "$T/m" --device cuda --batch "$T/prompts" -n 60 --spec ngram --draft 5 >"$T/out" 2>"$T/err" &&
    cmp -s "$T/bref" "$T/out" && ok || bad "cuda --batch --spec ngram differs: $(cat "$T/err")"
for head in mtp dspark; do
    "$BIN" tiny -o "$T/$head" --mtp $( [ $head = mtp ] && echo v4 || echo dspark ) --seed 4 --set 'compress_ratios=[0,0,4,128,4,128]' \
        --set sliding_window=8 >/dev/null 2>&1
    plain=$("$BIN" generate -m "$T/$head" --device cuda --tokens 5,6,7,8 -n 80 --ids 2>/dev/null)
    spec=$("$BIN" generate -m "$T/$head" --device cuda --tokens 5,6,7,8 -n 80 --ids --spec $head 2>"$T/err")
    if [ -n "$plain" ] && [ "$plain" = "$spec" ]; then ok; else bad "cuda --spec $head: ids differ from --spec none: $(cat "$T/err")"; fi
done

# the prefix cache on GPU sequences: a second process reuses the state from disk; a state stored by a CPU run is
# reused by a GPU run (the format does not depend on the device)
PP=$(seq -s, 5 3 480)
pc() { "$BIN" generate -m "$T/m" --device "$1" --tokens "$PP" -n 12 --ids --prefix-cache-dir "$T/pc$2" --prefix-cache-mb 64 --stats 2>"$T/stats"; }
cold=$(pc cuda 1); grep -q "1 disk write" "$T/stats" && ok || bad "cuda run did not store its prompt: $(cat "$T/stats")"
warm=$(pc cuda 1); [ -n "$cold" ] && [ "$warm" = "$cold" ] && ok || bad "cuda disk hit: ids differ from the cold run"
grep -q "1 disk hit" "$T/stats" && ok || bad "cuda: no disk hit: $(cat "$T/stats")"
pc cpu 2 >/dev/null; x=$(pc cuda 2); grep -q "1 disk hit" "$T/stats" && ok || bad "cuda run did not reuse the cpu-stored state: $(cat "$T/stats")"

expect_err "bad token on cuda" "outside the vocabulary" "$BIN" logits -m "$T/m" --device cuda --tokens 1,99999
expect_err "bad device" "--device must be cpu or cuda" "$BIN" logits -m "$T/m" --device tpu --tokens 1
printf 'garbage that is not a state file at all' >"$T/bad.state"
expect_err "damaged state on cuda" "not a dsv4 sequence state" "$BIN" logits -m "$T/m" --device cuda --tokens 1,2 --resume "$T/bad.state"
expect_ok "bench on cuda" "$BIN" bench -m "$T/m" --device cuda --prompt 64 --decode 16
# CUDA graphs (DSV4_CUDA_GRAPHS, on by default): bench says whether its steps ran as graphs, in the table and in --json
graphs() {   # graphs ENV-VALUE ON GRAPHED(>0 or 0)
    if env ${1:+DSV4_CUDA_GRAPHS=$1} "$BIN" bench -m "$T/m" --device cuda --no-bandwidth --prompt 16 --decode 8 --json "$T/g.json" >"$T/out" 2>"$T/err" &&
       grep -qE "^CUDA graphs +$2 +[0-9]+ steps as graphs" "$T/out" &&
       python3 -c 'import json, sys
g = json.load(open(sys.argv[1])); on = sys.argv[2] == "on"; c = g["cuda_graphs"]
sys.exit(0 if g["model"]["cuda_graphs"] is on and c["on"] is on and (c["graphed_steps"] > 0) == on and (on or c["direct_steps"] > 0) else 1)' "$T/g.json" "$2"
    then ok; else bad "bench with DSV4_CUDA_GRAPHS=${1:-unset}: $(grep -i graphs "$T/out") $(head -2 "$T/err")"; fi
}
graphs "" on
graphs 0 off
expect_err "DSV4_CUDA_GRAPHS=yes" "DSV4_CUDA_GRAPHS" env DSV4_CUDA_GRAPHS=yes "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
# FP8 tensor cores (DSV4_CUDA_MMA, on by default) in OFFICIAL mode: the model line says so; =0 turns them off
for v in "" 0; do
    if env ${v:+DSV4_CUDA_MMA=$v} "$BIN" bench -m "$T/m" --device cuda --mode official --no-bandwidth --prompt 16 --decode 4 >"$T/out" 2>"$T/err" &&
       grep -q "$([ -z "$v" ] && echo ', FP8 tensor cores' || echo 'FP8 tensor cores off (DSV4_CUDA_MMA=0)')" "$T/out"
    then ok; else bad "bench with DSV4_CUDA_MMA=${v:-unset}: $(head -1 "$T/out") $(head -2 "$T/err")"; fi
done
expect_err "DSV4_CUDA_MMA=yes" "DSV4_CUDA_MMA" env DSV4_CUDA_MMA=yes "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
# ... and they are observable: at K >= 1024 (all four partial sums of the tensor-core order in use) the OFFICIAL
# logits with them differ from the CUDA-core path's (at the presets' K <= 256 both give the same bits). A random
# tiny model is not calm (a changed last bit flips top-k and routing choices), so closeness is judged against the
# CPU's OFFICIAL run: the tensor-core path may not be much further from it than the CUDA-core path is.
# test_gpu_parity holds the memcmp matrix on this shape.
"$BIN" tiny -o "$T/wide" --preset flash-tiny --set 'compress_ratios=[0,0,4,128,4,128]' --set sliding_window=8 --set index_topk=3 \
    --set hidden_size=1024 --set q_lora_rank=1024 --set moe_intermediate_size=1024 --set o_lora_rank=512 >/dev/null 2>&1 || bad "tiny wide failed"
WT=$(seq -s, 3 2 200)
for v in 1 0; do
    expect_ok "wide logits DSV4_CUDA_MMA=$v" env DSV4_CUDA_MMA=$v "$BIN" logits -m "$T/wide" --device cuda --mode official --kv fp8 \
        --tokens "$WT" --out "$T/wide$v.npy"
done
expect_ok "wide logits on the cpu" "$BIN" logits -m "$T/wide" --device cpu --mode official --kv fp8 --tokens "$WT" --out "$T/widec.npy"
cmp -s "$T/wide1.npy" "$T/wide0.npy" && bad "K >= 1024: the tensor-core logits equal the CUDA-core ones bit for bit (path not taken?)" || ok
if python3 -c "import numpy" 2>/dev/null; then
    python3 -c "
import numpy as np, sys
t, f, c = (np.load(p) for p in sys.argv[1:4])
def dist(a): return np.abs(a - c).mean() / np.abs(c).mean(), 100 * (a.argmax(1) == c.argmax(1)).mean()
(rt, at), (rf, af) = dist(t), dist(f)
print('gpu cli: K >= 1024 against the CPU OFFICIAL run: tensor cores mean |dlogit| / mean |logit| %.3g, argmax %.1f%%; CUDA cores %.3g, %.1f%%' % (rt, at, rf, af))
sys.exit(0 if rt <= 2 * rf + 1e-3 else 1)" "$T/wide1.npy" "$T/wide0.npy" "$T/widec.npy" && ok || bad "K >= 1024: the tensor-core path is far further from the CPU than the CUDA-core path"
fi
# the tiled GEMM for steps of >= 256 tokens (DSV4_CUDA_GEMM: 2 = warpgroup MMAs by default, 1 = mma.sync, 3 = four warpgroups; k_mma_gemm.cu):
# the same bits as the small tiles, here on a 300-token step of the K >= 1024 model (test_gpu_gemm holds the kernel-level memcmp)
GT=$(seq 0 299 | awk '{printf "%s%d", (NR > 1 ? "," : ""), 3 + ($1 * 7) % 190}')
for v in 3 2 1 0; do
    expect_ok "wide logits DSV4_CUDA_GEMM=$v" env DSV4_CUDA_GEMM=$v "$BIN" logits -m "$T/wide" --device cuda --mode official --kv fp8 \
        --tokens "$GT" --out "$T/gemm$v.npy"
done
cmp -s "$T/gemm1.npy" "$T/gemm0.npy" && ok || bad "DSV4_CUDA_GEMM=1: the 300-token logits differ from the small tiles'"
cmp -s "$T/gemm2.npy" "$T/gemm0.npy" && ok || bad "DSV4_CUDA_GEMM=2 (warpgroup MMAs): the 300-token logits differ from the small tiles'"
cmp -s "$T/gemm3.npy" "$T/gemm0.npy" && ok || bad "DSV4_CUDA_GEMM=3 (four warpgroups): the 300-token logits differ from the small tiles'"
expect_err "DSV4_CUDA_GEMM=4" "DSV4_CUDA_GEMM" env DSV4_CUDA_GEMM=4 "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
ST=$(seq -s, 5 3 122)
# switch_same_bits VAR WHAT: the K >= 1024 model's steps of 1 to 8 tokens give the same logits with VAR=1 as with
# VAR=0 (WHAT: the kernels of 0). Kernel switches that change speed only; the kernel-level memcmps are the unit tests'.
switch_same_bits() {
    for v in 1 0; do
        expect_ok "wide decode steps $1=$v" env "$1=$v" "$BIN" logits -m "$T/wide" --device cuda --mode official --kv fp8 \
            --tokens "$ST" --chunks 1,2,3,4,5,6,7,8 --out "$T/sw_$1_$v.npy"
    done
    cmp -s "$T/sw_$1_1.npy" "$T/sw_$1_0.npy" && ok || bad "$1=1: the logits of steps of 1 to 8 tokens differ from $2"
}
switch_same_bits DSV4_CUDA_STREAM "the small tiles'"   # the streaming kernel for <= 8 tokens (off by default, k_mma_stream.cu)
expect_err "DSV4_CUDA_STREAM=2" "DSV4_CUDA_STREAM" env DSV4_CUDA_STREAM=2 "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
# the lean FP4 expert kernel (on by default; whole 128-column chunks: the K >= 1024 model has them), on unpacked
# experts (packed ones have their own kernel)
export DSV4_CUDA_EXPERT_PACK=0
switch_same_bits DSV4_CUDA_EXPERT_LEAN "k_mma_expert's"
unset DSV4_CUDA_EXPERT_PACK
# FP4 routed experts packed at load (on by default, k_mma.cu cu_fp4_frag_pack): the unpacked experts' logits
switch_same_bits DSV4_CUDA_EXPERT_PACK "the unpacked experts'"
expect_err "DSV4_CUDA_EXPERT_PACK=2" "DSV4_CUDA_EXPERT_PACK" env DSV4_CUDA_EXPERT_PACK=2 "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
# the routed experts on native FP8 tensor cores (DSV4_CUDA_NATIVE_EXPERTS=1, off by default; k_expert_nat.cu): their own
# arithmetic, so not the default's bits, but one order for every step: a 2,200-token prompt in one step (the native
# GEMM: 558 plan tiles) = the same prompt in steps of 1 to 8, 300 and 1,864 tokens (the small-tile kernel), and no
# further from the CPU's OFFICIAL run than the default path is (test_gpu_mma holds the kernels to the exact sum)
NT=$(seq 0 2199 | awk '{printf "%s%d", (NR > 1 ? "," : ""), 3 + ($1 * 11) % 190}')
expect_ok "native experts, one step" env DSV4_CUDA_NATIVE_EXPERTS=1 "$BIN" logits -m "$T/wide" --device cuda --mode official --kv fp8 \
    --tokens "$NT" --out "$T/nat1.npy"
expect_ok "native experts, chunks" env DSV4_CUDA_NATIVE_EXPERTS=1 "$BIN" logits -m "$T/wide" --device cuda --mode official --kv fp8 \
    --tokens "$NT" --chunks 1,2,3,4,5,6,7,8,300,1864 --out "$T/nat2.npy"
cmp -s "$T/nat1.npy" "$T/nat2.npy" && ok || bad "DSV4_CUDA_NATIVE_EXPERTS=1: --chunks logits differ from one step"
expect_ok "native experts off" env -u DSV4_CUDA_NATIVE_EXPERTS "$BIN" logits -m "$T/wide" --device cuda --mode official --kv fp8 \
    --tokens "$NT" --out "$T/nat0.npy"
cmp -s "$T/nat1.npy" "$T/nat0.npy" && bad "DSV4_CUDA_NATIVE_EXPERTS=1: the default's bits (path not taken?)" || ok
if python3 -c "import numpy" 2>/dev/null; then
    expect_ok "native experts: the cpu" "$BIN" logits -m "$T/wide" --device cpu --mode official --kv fp8 --tokens "$NT" --out "$T/natc.npy"
    python3 -c "
import numpy as np, sys
n, d, c = (np.load(p) for p in sys.argv[1:4])
def dist(a): return np.abs(a - c).mean() / np.abs(c).mean(), 100 * (a.argmax(1) == c.argmax(1)).mean()
(rn, an), (rd, ad) = dist(n), dist(d)
print('gpu cli: 2,200 tokens against the CPU OFFICIAL run: native experts mean |dlogit| / mean |logit| %.3g, argmax %.1f%%; default %.3g, %.1f%%' % (rn, an, rd, ad))
sys.exit(0 if rn <= 2 * rd + 1e-3 else 1)" "$T/nat1.npy" "$T/nat0.npy" "$T/natc.npy" && ok || bad "native experts: far further from the CPU than the default path"
fi
expect_err "DSV4_CUDA_NATIVE_EXPERTS=2" "DSV4_CUDA_NATIVE_EXPERTS" env DSV4_CUDA_NATIVE_EXPERTS=2 "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
# a layer's independent chains on a second stream (on by default): one stream's logits
switch_same_bits DSV4_CUDA_BRANCH "one stream's"
expect_err "DSV4_CUDA_EXPERT_LEAN=2" "DSV4_CUDA_EXPERT_LEAN" env DSV4_CUDA_EXPERT_LEAN=2 "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
expect_err "DSV4_CUDA_IDX_MMA=2" "DSV4_CUDA_IDX_MMA" env DSV4_CUDA_IDX_MMA=2 "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
# the tensor-core attention (opt-in, DSV4_CUDA_ATT_MMA=1): chunked = one call at the model level too
for kv in fp8 bf16; do
    expect_ok "att mma logits $kv" env DSV4_CUDA_ATT_MMA=1 "$BIN" logits -m "$T/m" --device cuda --mode official --kv $kv --tokens "$TOK" --out "$T/am1.npy"
    expect_ok "att mma chunks $kv" env DSV4_CUDA_ATT_MMA=1 "$BIN" logits -m "$T/m" --device cuda --mode official --kv $kv --tokens "$TOK" \
        --chunks 3,50,1,7,64 --out "$T/am2.npy"
    cmp -s "$T/am1.npy" "$T/am2.npy" && ok || bad "DSV4_CUDA_ATT_MMA=1 $kv: --chunks logits differ from one call"
    "$BIN" logits -m "$T/m" --device cuda --mode official --kv $kv --tokens "$TOK" --out "$T/am0.npy" 2>/dev/null
    cmp -s "$T/am1.npy" "$T/am0.npy" && bad "DSV4_CUDA_ATT_MMA=1 $kv: the same bits as the CUDA-core attention (path not taken?)" || ok
done
expect_err "DSV4_CUDA_ATT_MMA=yes" "DSV4_CUDA_ATT_MMA" env DSV4_CUDA_ATT_MMA=yes "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
# same_logits VAR "MODE KV" ...: the model's logits with the speed switch VAR at 1 and at 0 are the same bytes, with
# steps of one token among the chunks (the decode-sized launches); VAR=2 is refused with a line naming VAR
same_logits() {
    local var=$1 mk v
    shift
    for mk in "$@"; do
        set -- $mk
        for v in 1 0; do
            expect_ok "$var=$v logits $mk" env "$var=$v" "$BIN" logits -m "$T/m" --device cuda --mode $1 --kv $2 --tokens "$TOK" \
                --chunks 3,1,1,50,1,7,1,64 --out "$T/sw$v.npy"
        done
        cmp -s "$T/sw1.npy" "$T/sw0.npy" && ok || bad "$var=1 $mk: logits differ from $var=0"
    done
    expect_err "$var=2" "$var" env "$var=2" "$BIN" logits -m "$T/m" --device cuda --tokens 1,2
}
# the decode-sized attention scores kernel (DSV4_CUDA_ATT_DEC, on by default): the same bits as k_att_scores
# (test_gpu_attention holds the kernel-level memcmp)
same_logits DSV4_CUDA_ATT_DEC "official fp8" "official bf16" "exact fp8" "official f32"
# the one-launch decode attention (DSV4_CUDA_ATT_FUSED, off by default): the same bits as the three kernels
same_logits DSV4_CUDA_ATT_FUSED "official fp8" "exact bf16"
# the one-launch decode attention on tensor cores (DSV4_CUDA_ATT_DEC_MMA, on by default where DSV4_CUDA_ATT_MMA=1):
# the same bits as the three tensor-core kernels
DSV4_CUDA_ATT_MMA=1 same_logits DSV4_CUDA_ATT_DEC_MMA "official fp8" "official bf16"
finish
