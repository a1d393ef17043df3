/* Penalties, the undecodable-id mask and log-probabilities: see logits.h. */
#include "server/logits.h"
#include "dsv4.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int server_logits_apply(void *ctx, const int32_t *generated, int n_generated, float *logits, int vocab) {
    server_logits_proc *p = ctx;
    for (int i = p->mask_from > 0 ? p->mask_from : vocab; i < vocab; i++) logits[i] = -INFINITY;
    if ((p->presence == 0.0f && p->frequency == 0.0f) || n_generated == 0) return 0;
    if (!p->counts || p->vocab != vocab) {
        free(p->counts);
        p->counts = calloc((size_t)vocab, sizeof *p->counts);
        if (!p->counts) return DSV4_E_NOMEM;
        p->vocab = vocab;
    }
    /* counts are rebuilt from the output each time, then cleared: O(tokens), no state to keep in sync */
    for (int i = 0; i < n_generated; i++)
        if (generated[i] >= 0 && generated[i] < vocab) p->counts[generated[i]]++;
    for (int i = 0; i < n_generated; i++) {
        const int32_t t = generated[i];
        if (t < 0 || t >= vocab || p->counts[t] == 0) continue;
        logits[t] -= p->frequency * (float)p->counts[t] + p->presence;
        p->counts[t] = 0;
    }
    return 0;
}

void server_logits_proc_free(server_logits_proc *p) {
    free(p->counts);
    p->counts = NULL;
}

float server_logprobs(const float *logits, int vocab, int32_t token, int k, server_logprob *top) {
    float mx = -INFINITY;
    for (int i = 0; i < vocab; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    if (k > 20) k = 20;
    int n = 0;
    /* insertion into a k-long list: k is small, vocab is scanned once */
    for (int i = 0; i < vocab && k > 0; i++) {
        const float v = logits[i];
        if (n == k && !(v > top[n - 1].logprob)) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && top[j - 1].logprob < v) { top[j] = top[j - 1]; j--; }
        top[j].id = i;
        top[j].logprob = v;
    }
    for (int i = 0; i < n; i++) top[i].logprob = (float)((double)top[i].logprob - lse);
    return (float)((double)logits[token] - lse);
}
