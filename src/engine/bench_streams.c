/* Multi-stream decode benchmark: see bench_streams.h. */
#include "engine/bench_streams.h"
#include "model/route_count.h"
#include "model/footprint.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    int n, vocab;
    dsv4_seq **seq;
    int32_t *prompts;        /* [n][prompt_len] */
    int32_t *next;           /* [n]: the token each stream feeds next */
    int32_t *drawn;          /* [n]: the token each stream's step drew (becomes next) */
    dsv4_step_item *items;   /* [n] */
} bench_state;

/* Each stream's next token is its greedy draw, made on the model's device as the scheduler (dsv4 serve) makes it:
 * only the ids come back. (Until 2026-12-04 the bench copied every stream's logits row to the host and took the
 * argmax there: 132 MB and ~33M comparisons a step at 256 streams on the Flash shape, which no serving step does.) */
static const dsv4_sampling greedy = { 0.0f, 0, 1.0f, 0.0f, 0, 0 };

static dsv4_step_item next_token_item(bench_state *b, int i, const int32_t *tokens, int n_tokens) {
    return (dsv4_step_item){ .seq = b->seq[i], .tokens = tokens, .n_tokens = n_tokens, .want = DSV4_LOGITS_NONE,
                             .sample = &greedy, .token = &b->drawn[i] };
}

static void bench_free(bench_state *b) {
    if (b->seq) for (int i = 0; i < b->n; i++) dsv4_seq_free(b->seq[i]);
    free(b->seq);
    free(b->prompts);
    free(b->next);
    free(b->drawn);
    free(b->items);
}

static int bench_alloc(dsv4_model *m, bench_state *b, int n, int prompt_len, dsv4_error *err) {
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    memset(b, 0, sizeof *b);
    b->n = n;
    b->vocab = info.vocab_size;
    b->seq = calloc((size_t)n, sizeof *b->seq);
    b->prompts = malloc(sizeof(int32_t) * (size_t)n * (size_t)prompt_len);
    b->next = malloc(sizeof(int32_t) * (size_t)n);
    b->drawn = malloc(sizeof(int32_t) * (size_t)n);
    b->items = calloc((size_t)n, sizeof *b->items);
    if (!b->seq || !b->prompts || !b->next || !b->drawn || !b->items) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        int rc = dsv4_seq_new(m, &b->seq[i], err);
        if (rc) return rc;
        for (int k = 0; k < prompt_len; k++)
            b->prompts[(int64_t)i * prompt_len + k] = (int32_t)(((int64_t)k * 7919 + (int64_t)i * 104729 + 13) % b->vocab);
    }
    return 0;
}

/* One step in which every stream decodes its next token; the greedy pick becomes the next input. */
static int decode_all(dsv4_model *m, bench_state *b, dsv4_error *err) {
    for (int i = 0; i < b->n; i++) b->items[i] = next_token_item(b, i, &b->next[i], 1);
    const int rc = dsv4_step(m, b->items, b->n, err);
    if (!rc) memcpy(b->next, b->drawn, sizeof(int32_t) * (size_t)b->n);
    return rc;
}

int bench_step_routed_bytes(dsv4_model *m, dsv4_step_item *items, int n, double *bytes, dsv4_error *err) {
    int rc = model_count_routes(m, 1, err);
    if (!rc) rc = dsv4_step(m, items, n, err);
    expert_profile p = { 0 };
    if (!rc) rc = model_route_profile(m, &p, err);
    dsv4_error off;
    model_count_routes(m, 0, &off);
    if (rc) return rc;
    double routed = 0;
    for (int l = 0; l < p.n_layers; l++)
        for (int e = 0; e < p.n_routed; e++)
            if (p.counts[(int64_t)l * p.n_routed + e]) routed += (double)dsv4_expert_weight_bytes(&m->layers[l], e);
    expert_profile_free(&p);
    *bytes = routed;
    return 0;
}

int dsv4_bench_streams(dsv4_model *m, int n_streams, int prompt_len, int decode_steps,
                       dsv4_bench_streams_result *out, dsv4_error *err) {
    return dsv4_bench_streams_hooked(m, n_streams, prompt_len, decode_steps, NULL, NULL, out, err);
}

int dsv4_bench_streams_hooked(dsv4_model *m, int n_streams, int prompt_len, int decode_steps,
                              void (*before_timed)(dsv4_model *m, void *ctx), void *ctx, dsv4_bench_streams_result *out,
                              dsv4_error *err) {
    memset(out, 0, sizeof *out);
    if (n_streams < 1 || prompt_len < 1 || decode_steps < 1)
        return dsv4_fail(err, DSV4_E_ARG, "bench: streams, prompt length and decode steps must be >= 1");
    bench_state b;
    int rc = bench_alloc(m, &b, n_streams, prompt_len, err);
    if (rc) { bench_free(&b); return rc; }
    for (int i = 0; i < n_streams; i++) b.items[i] = next_token_item(&b, i, b.prompts + (int64_t)i * prompt_len, prompt_len);
    const double t0 = now_s();
    rc = dsv4_step(m, b.items, n_streams, err);
    out->prefill_s = now_s() - t0;
    if (!rc) memcpy(b.next, b.drawn, sizeof(int32_t) * (size_t)n_streams);
    if (!rc) rc = decode_all(m, &b, err);   /* warm-up: sizes the workspace for N decode tokens */
    if (!rc && before_timed) before_timed(m, ctx);
    double total = 0, worst = 0;
    const uint64_t routed0 = m->routed_bytes;
    for (int s = 0; !rc && s < decode_steps; s++) {
        const double ts = now_s();
        rc = decode_all(m, &b, err);
        const double dt = now_s() - ts;
        total += dt;
        if (dt > worst) worst = dt;
    }
    /* a CUDA model's MoE adds to routed_bytes only for its host-memory experts: one more step, counted */
    double counted = -1;
    if (!rc && (m->cuda || m->routed_bytes == routed0)) {
        for (int i = 0; i < b.n; i++) b.items[i] = next_token_item(&b, i, &b.next[i], 1);
        rc = bench_step_routed_bytes(m, b.items, b.n, &counted, err);
    }
    bench_free(&b);
    if (rc) return rc;
    out->n_streams = n_streams;
    out->prompt_len = prompt_len;
    out->decode_steps = decode_steps;
    out->decode_s = total;
    out->decode_tok_s = (double)n_streams * decode_steps / (total > 0 ? total : 1e-12);
    out->step_ms_mean = 1e3 * total / decode_steps;
    out->step_ms_max = 1e3 * worst;
    if (counted < 0 && m->routed_bytes != routed0)
        out->step_bytes = (double)dsv4_fixed_weight_bytes(m) + (double)(m->routed_bytes - routed0) / decode_steps;
    else if (counted >= 0)
        out->step_bytes = (double)dsv4_fixed_weight_bytes(m) + counted;
    out->step_flops = (double)n_streams * (double)dsv4_token_linear_flops(m);
    return 0;
}

int dsv4_bench_streams_table(dsv4_model *m, const int *counts, int n_counts, int prompt_len, int decode_steps,
                             double bw_gbs, double peak_gflops, FILE *f, dsv4_bench_streams_result *rows,
                             dsv4_error *err) {
    double base = 0;
    if (f) {
        fprintf(f, "%8s %14s %9s %16s %15s %12s %11s %10s", "streams", "decode tok/s", "speed-up", "ms/token/stream",
                "max step ms", "prefill s", "GB/step", "roofline");
        if (peak_gflops > 0) fprintf(f, " %11s %7s", "GFLOP/step", "of peak");
        fprintf(f, "\n");
    }
    for (int c = 0; c < n_counts; c++) {
        dsv4_bench_streams_result r;
        int rc = dsv4_bench_streams(m, counts[c], prompt_len, decode_steps, &r, err);
        if (rc) return rc;
        if (c == 0) base = r.decode_tok_s;
        if (rows) rows[c] = r;
        if (f) {
            fprintf(f, "%8d %14.1f %8.2fx %16.2f %15.2f %12.3f", r.n_streams, r.decode_tok_s,
                    base > 0 ? r.decode_tok_s / base : 0.0, r.step_ms_mean, r.step_ms_max, r.prefill_s);
            if (r.step_bytes > 0) fprintf(f, " %11.3f", r.step_bytes / 1e9);
            else fprintf(f, " %11s", "-");
            if (r.step_bytes > 0 && bw_gbs > 0 && r.step_ms_mean > 0)
                fprintf(f, " %9.1f%%", 100.0 * r.step_bytes / (r.step_ms_mean * 1e-3) / 1e9 / bw_gbs);
            else fprintf(f, " %10s", "-");
            if (peak_gflops > 0 && r.step_ms_mean > 0)
                fprintf(f, " %11.2f %6.1f%%", r.step_flops / 1e9, 100.0 * r.step_flops / (r.step_ms_mean * 1e-3) / 1e9 / peak_gflops);
            fprintf(f, "\n");
            fflush(f);
        }
    }
    return 0;
}
