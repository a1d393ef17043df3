/* simple: the smallest complete use of the dsv4 API. Load a checkpoint, prefill a prompt of token ids in one
 * step, then decode greedily one token per step and print the generated ids.
 *
 *   simple MODEL_DIR [N_NEW [TOKEN ...]]        e.g.  simple /tmp/tiny 16 1 2 3
 *
 * Prints the N_NEW generated ids comma-separated on one line (stopping after the end-of-sequence token), which
 * is what `dsv4 generate -m MODEL_DIR --tokens 1,2,3 -n 16 --ids` prints. Uses only dsv4.h. */
#include <dsv4.h>
#include <stdio.h>
#include <stdlib.h>

/* Every dsv4 call that can fail returns a status and fills a dsv4_error with a one-line message. */
static int fail(const char *what, const dsv4_error *err) {
    fprintf(stderr, "simple: %s: %s\n", what, err->msg);
    return 1;
}

/* Greedy decoding picks the most likely token; ties go to the lower id, as in dsv4's own sampler. */
static int32_t argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: simple MODEL_DIR [N_NEW [TOKEN ...]]\n");
        return 2;
    }
    const int n_new = argc > 2 ? atoi(argv[2]) : 16;
    int n_prompt = argc > 3 ? argc - 3 : 3;
    int32_t *prompt = malloc(sizeof *prompt * (size_t)n_prompt);
    if (!prompt) return 1;
    for (int i = 0; i < n_prompt; i++) prompt[i] = argc > 3 ? atoi(argv[3 + i]) : i + 1;

    /* The model: validated completely on load, weights memory-mapped. Options left at zero are the defaults
     * (EXACT mode, one thread per CPU, f32 KV cache); quiet keeps stderr clean. */
    dsv4_error err;
    dsv4_model *model = NULL;
    dsv4_load_opts opts = {0};
    opts.quiet = 1;
    if (dsv4_model_load(argv[1], &opts, &model, &err)) return fail("load", &err);
    dsv4_model_info info;
    dsv4_model_get_info(model, &info);

    /* A sequence owns all of one stream's state (position, KV cache, compressor states); the caller owns it. */
    dsv4_seq *seq = NULL;
    if (dsv4_seq_new(model, &seq, &err)) return fail("new sequence", &err);
    float *logits = malloc(sizeof *logits * (size_t)info.vocab_size);
    if (!logits) return 1;

    /* Prefill: the whole prompt in one step, asking only for the last position's logits. */
    dsv4_step_item item = {0};
    item.seq = seq;
    item.tokens = prompt;
    item.n_tokens = n_prompt;
    item.want = DSV4_LOGITS_LAST;
    item.logits = logits;
    if (dsv4_step(model, &item, 1, &err)) return fail("prefill", &err);

    /* Decode: the same call with one token; the sequence advances from its own position. */
    for (int i = 0; i < n_new; i++) {
        int32_t next = argmax(logits, info.vocab_size);
        printf(i ? ",%d" : "%d", (int)next);
        if (next == info.eos_id || i + 1 == n_new) break;
        item.tokens = &next;
        item.n_tokens = 1;
        if (dsv4_step(model, &item, 1, &err)) return fail("decode", &err);
    }
    printf("\n");

    dsv4_seq_free(seq);
    dsv4_model_free(model);
    free(logits);
    free(prompt);
    return 0;
}
