#!/usr/bin/env bash
# The same logits whatever the thread count (pool.h's promise: the cut of a loop over threads never changes a value),
# for the whole model: every parallel loop of a step (linears, the mHC mixes and norms by token and column block,
# experts, attention) at 1, 2 and 3 threads, one-shot and in one-token steps, in both numeric modes, by cmp. The model
# is 1024 wide so that hc_post's 512-column blocks split a token across threads.
. "$(dirname "$0")/lib.sh"
M="$T/model"
"$BIN" tiny -o "$M" --preset flash-tiny --seed 9 --set hidden_size=1024 --set q_lora_rank=512 --set o_lora_rank=256 \
    --set moe_intermediate_size=256 >/dev/null 2>&1 || { bad "tiny model"; finish; }
TOK=$(awk 'BEGIN{for(i=0;i<20;i++) printf "%s%d", (i?",":""), (i*37+3)%200}')
for mode in exact official; do
    for chunks in "" "--chunks 6"; do
        for th in 1 2 3; do
            expect_ok "logits $mode threads $th $chunks" "$BIN" logits -m "$M" --mode $mode --threads $th --tokens "$TOK" $chunks \
                --out "$T/l_$th.npy"
        done
        for th in 2 3; do
            if cmp -s "$T/l_1.npy" "$T/l_$th.npy"; then ok; else bad "$mode $chunks: logits at $th threads differ from 1 thread"; fi
        done
    done
done
finish
