/* streams: several sequences advanced together in one step, and one of them saved, restored and continued.
 *
 *   streams MODEL_DIR [N_NEW]
 *
 * Three prompts (1,2,3 / 4,5,6,7 / 8) are prefilled together in one dsv4_step and decoded greedily together,
 * one token per stream per step. Halfway through, stream 1's state is saved to memory; the run goes on. Then the
 * saved state is loaded into a new sequence, which decodes the second half alone: it must produce exactly what
 * stream 1 produced in the batch (state is plain data, and a sequence's result does not depend on its
 * neighbours). Prints "stream I: ids" per stream and "restored: identical"; exits 1 if anything differs.
 * Uses only dsv4.h. */
#include <dsv4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_STREAMS 3
#define MAX_NEW 256

static int fail(const char *what, const dsv4_error *err) {
    fprintf(stderr, "streams: %s: %s\n", what, err->msg);
    return 1;
}

static int32_t argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: streams MODEL_DIR [N_NEW]\n");
        return 2;
    }
    int n_new = argc > 2 ? atoi(argv[2]) : 12;
    if (n_new < 2 || n_new > MAX_NEW) n_new = 12;
    const int half = n_new / 2;
    static const int32_t p0[] = {1, 2, 3}, p1[] = {4, 5, 6, 7}, p2[] = {8};
    const int32_t *prompts[N_STREAMS] = {p0, p1, p2};
    const int lens[N_STREAMS] = {3, 4, 1};

    dsv4_error err;
    dsv4_model *model = NULL;
    dsv4_load_opts opts = {0};
    opts.quiet = 1;
    if (dsv4_model_load(argv[1], &opts, &model, &err)) return fail("load", &err);
    dsv4_model_info info;
    dsv4_model_get_info(model, &info);
    const size_t V = (size_t)info.vocab_size;

    /* One sequence per stream, one logits row per stream (each item writes its own, caller-owned). */
    dsv4_seq *seq[N_STREAMS];
    float *logits = malloc(sizeof *logits * V * N_STREAMS);
    int32_t out[N_STREAMS][MAX_NEW], next[N_STREAMS];
    dsv4_step_item items[N_STREAMS];
    if (!logits) return 1;
    memset(items, 0, sizeof items);
    for (int s = 0; s < N_STREAMS; s++) {
        if (dsv4_seq_new(model, &seq[s], &err)) return fail("new sequence", &err);
        items[s].seq = seq[s];
        items[s].tokens = prompts[s];
        items[s].n_tokens = lens[s];   /* a ragged batch: each item brings its own number of tokens */
        items[s].want = DSV4_LOGITS_LAST;
        items[s].logits = logits + (size_t)s * V;
    }
    /* Prefill all three in one step, then decode all three in one step per token. */
    if (dsv4_step(model, items, N_STREAMS, &err)) return fail("prefill", &err);
    void *saved = NULL;
    size_t saved_len = 0;
    for (int t = 0; t < n_new; t++) {
        for (int s = 0; s < N_STREAMS; s++) {
            next[s] = argmax(logits + (size_t)s * V, info.vocab_size);
            out[s][t] = next[s];
            items[s].tokens = &next[s];
            items[s].n_tokens = 1;
        }
        if (t + 1 == n_new) break;
        /* Halfway: keep stream 1's whole state (its position is its prompt plus the tokens fed so far). The
         * buffer is malloc'd and ours; dsv4_seq_save would write the same bytes to a file, atomically. */
        if (t + 1 == half && dsv4_seq_save_mem(seq[1], &saved, &saved_len, &err)) return fail("save", &err);
        if (dsv4_step(model, items, N_STREAMS, &err)) return fail("decode", &err);
    }
    for (int s = 0; s < N_STREAMS; s++) {
        printf("stream %d:", s);
        for (int t = 0; t < n_new; t++) printf(t ? ",%d" : " %d", (int)out[s][t]);
        printf("\n");
    }

    /* Restore: a new sequence from the saved bytes (validated: model, mode, shapes, checksum), then the rest of
     * stream 1 alone. Its next token comes from feeding the one it had not yet fed when it was saved. */
    dsv4_seq *restored = NULL;
    if (dsv4_seq_load_mem(model, saved, saved_len, &restored, &err)) return fail("restore", &err);
    printf("saved at position %lld (%zu bytes)\n", (long long)dsv4_seq_position(restored), saved_len);
    dsv4_step_item one = {0};
    one.seq = restored;
    one.want = DSV4_LOGITS_LAST;
    one.logits = logits;
    int same = 1;
    for (int t = half; t < n_new; t++) {
        one.tokens = &out[1][t - 1];
        one.n_tokens = 1;
        if (dsv4_step(model, &one, 1, &err)) return fail("decode restored", &err);
        if (argmax(logits, info.vocab_size) != out[1][t]) same = 0;
    }
    printf("restored: %s\n", same ? "identical" : "DIFFERENT");

    dsv4_seq_free(restored);
    for (int s = 0; s < N_STREAMS; s++) dsv4_seq_free(seq[s]);
    dsv4_model_free(model);
    free(saved);
    free(logits);
    return same ? 0 : 1;
}
