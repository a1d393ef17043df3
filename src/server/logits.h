/* Per-request logits processing for the server, run on the engine thread through the scheduler's
 * dsv4_logits_hook (before sampling) and its token observer (after sampling):
 *   - ids the tokenizer cannot decode (model rows past the tokenizer's vocabulary) are never sampled;
 *   - OpenAI presence / frequency penalties over the tokens generated so far:
 *       logit[t] -= frequency * count(t) + presence * (count(t) > 0);
 *   - log-probabilities of the sampled token and the top-k alternatives, from the row the sampler drew from
 *     (after the hook), as OpenAI reports them (log-softmax of the processed logits, before temperature).
 * With no penalty and nothing to mask the hook leaves the row untouched, so greedy output is exactly the
 * engine's. */
#ifndef DSV4_SERVER_LOGITS_H
#define DSV4_SERVER_LOGITS_H
#include <stdint.h>

typedef struct {
    int   mask_from;          /* ids >= mask_from are never sampled (the tokenizer's vocabulary size) */
    float presence, frequency;
    int   *counts;            /* [vocab] scratch, owned (NULL until penalties need it) */
    int   vocab;
} server_logits_proc;

/* The dsv4_logits_hook function; ctx is a server_logits_proc. 0, or DSV4_E_NOMEM. */
int server_logits_apply(void *ctx, const int32_t *generated, int n_generated, float *logits, int vocab);
void server_logits_proc_free(server_logits_proc *p);

/* One token's log-probability and up to k alternatives (highest first, ties by lower id). */
typedef struct {
    int32_t id;
    float logprob;
} server_logprob;

/* logprob of `token` in `logits` (log-softmax), and the top k (k <= 20) into top[0..k). */
float server_logprobs(const float *logits, int vocab, int32_t token, int k, server_logprob *top);
#endif
