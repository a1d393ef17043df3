/* Multi-stream decode benchmark (issue 3, for `dsv4 bench --streams 1,2,4,...`).
 *
 * Workload per stream count N: N fresh sequences, each with its own short prompt (different tokens, so MoE
 * routing differs between streams), prefilled together in one ragged step; then one untimed warm-up decode
 * step and `decode_steps` timed steps in which every stream decodes one token (its own greedy next token, drawn on
 * the model's device as dsv4 serve draws it: no logits row comes back) in the same dsv4_step call. Decode on the CPU is bound by reading weights, which a step reads once for all of
 * its tokens, so aggregate tokens/s should grow with N until compute dominates. */
#ifndef DSV4_ENGINE_BENCH_STREAMS_H
#define DSV4_ENGINE_BENCH_STREAMS_H
#include "dsv4.h"
#include <stdio.h>

typedef struct {
    int n_streams, prompt_len, decode_steps;
    double prefill_s;        /* the one ragged prefill step of all N prompts (time to first token) */
    double decode_s;         /* the timed decode steps */
    double decode_tok_s;     /* aggregate: N * decode_steps / decode_s */
    double step_ms_mean;     /* per-stream latency: every stream gets one token per step */
    double step_ms_max;
    double step_bytes;       /* weight bytes a timed step reads: every fixed weight and the distinct routed experts
                                its tokens use (CPU: counted in the timed steps; cuda, whose MoE does not count them:
                                from the routing of one more, untimed step) */
    double step_flops;       /* the linears' multiply-adds of a step, 2 flops each: N x dsv4_token_linear_flops */
} dsv4_bench_streams_result;

/* Run the workload for one stream count. */
int dsv4_bench_streams(dsv4_model *m, int n_streams, int prompt_len, int decode_steps,
                       dsv4_bench_streams_result *out, dsv4_error *err);
/* The same, calling before_timed(m, ctx) (if not NULL) after the prefill and the warm-up step, just before the
 * timed decode steps: `bench --streams --profile` starts the GPU's per-stage timing there. */
int dsv4_bench_streams_hooked(dsv4_model *m, int n_streams, int prompt_len, int decode_steps,
                              void (*before_timed)(dsv4_model *m, void *ctx), void *ctx, dsv4_bench_streams_result *out,
                              dsv4_error *err);

/* One step of items with the routing counted (model/route_count.h): *bytes = the weight bytes of the distinct
 * (main layer, routed expert) pairs its tokens chose, on either device (the CPU's own count, m->routed_bytes, is
 * the same number: test_bench_bytes). */
int bench_step_routed_bytes(dsv4_model *m, dsv4_step_item *items, int n, double *bytes, dsv4_error *err);

/* Run it for every count in turn and print one table row per count to `f` (NULL: no output), with the
 * speed-up of aggregate decode tokens/s over the first count, the weight bytes per step and, when bw_gbs > 0,
 * the roofline fraction: (step bytes / step time) / bw_gbs, i.e. aggregate tokens/s against what reading the
 * step's distinct weights at the measured bandwidth allows; when peak_gflops > 0, the same for the step's linear
 * work against the measured multiply-add peak (backend/cpu/peak.h): a step is bound by the larger of the two
 * times, so the bandwidth roofline is out of reach where the compute fraction would pass 100 % first. rows (may be
 * NULL) receives n_counts results. */
int dsv4_bench_streams_table(dsv4_model *m, const int *counts, int n_counts, int prompt_len, int decode_steps,
                             double bw_gbs, double peak_gflops, FILE *f, dsv4_bench_streams_result *rows,
                             dsv4_error *err);
#endif
