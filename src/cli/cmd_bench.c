/* dsv4 bench: fixed workloads, tokens/s and GB/s against the machine's measured memory bandwidth. */
#include "backend/cpu/isa.h"
#include "backend/cpu/membw.h"
#include "backend/cpu/peak.h"
#include "backend/cuda/cuda_backend.h"
#include "cli/cli.h"
#include "engine/constraint_bench.h"
#include "engine/bench_streams.h"
#include "engine/drafter_dspark.h"
#include "engine/drafter_mtp.h"
#include "engine/drafter_named.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "model/fp4_planes.h"
#include "model/footprint.h"
#include "model/expert_place.h"
#include "model/model.h"
#include "model/route_count.h"
#include "model/tiny.h"
#include "state/kvrows.h"
#include "state/sequence.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

static const char *CMD = "bench";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Synthetic models: official-format checkpoints with random weights, written once and cached. The "2g"
 * model's weights (2.1 GB) and active bytes per token (~0.6 GB) are far beyond any CPU cache level. */
typedef struct {
    const char *name;
    const char *sets[24];
} synthetic;

static const synthetic synthetics[] = {
    {"flash-2g", {"hidden_size=2048", "num_hidden_layers=8", "compress_ratios=[0,0,4,128,4,128,4,128]",
                  "num_attention_heads=16", "head_dim=512", "q_lora_rank=1024", "o_lora_rank=1024", "o_groups=4",
                  "n_routed_experts=64", "num_experts_per_tok=6", "moe_intermediate_size=1024", "vocab_size=32768",
                  "index_n_heads=16", "index_topk=64", "sliding_window=128", "num_hash_layers=2", NULL}},
    /* the real shapes (spec §1.1), big matrices as holes filled where the model reads them (model/synthetic.h) */
    {"flash", {"hidden_size=4096", "num_hidden_layers=43", "compress_ratios=[0,0,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4]",
               "num_attention_heads=64", "head_dim=512", "q_lora_rank=1024", "o_lora_rank=1024", "o_groups=8",
               "n_routed_experts=256", "num_experts_per_tok=6", "moe_intermediate_size=2048", "vocab_size=129280",
               "index_n_heads=64", "index_head_dim=128", "index_topk=512", "sliding_window=128", "num_hash_layers=3",
               "routed_scaling_factor=1.5", "dsv4_synthetic=holes", NULL}},
    {"pro", {"hidden_size=7168", "num_hidden_layers=61", "compress_ratios=[128,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4,128,4]",
             "num_attention_heads=128", "head_dim=512", "q_lora_rank=1536", "o_lora_rank=1024", "o_groups=16",
             "n_routed_experts=384", "num_experts_per_tok=6", "moe_intermediate_size=3072", "vocab_size=129280",
             "index_n_heads=64", "index_head_dim=128", "index_topk=1024", "sliding_window=128", "num_hash_layers=3",
             "routed_scaling_factor=2.5", "dsv4_synthetic=holes", NULL}},
    {"small", {"hidden_size=512", "num_hidden_layers=4", "compress_ratios=[0,4,128,4]", "num_attention_heads=8",
               "head_dim=256", "n_routed_experts=16", "num_experts_per_tok=4", "moe_intermediate_size=256",
               "vocab_size=4096", NULL}},
};

/* The synthetic model's folder, written once: /tmp/dsv4-synthetic-NAME, or with a routing skew (--route-skew S:
 * config "dsv4_route_skew", model/tiny.c gate_bias_values) /tmp/dsv4-synthetic-NAME-skewS. */
static int synthetic_dir(const char *name, const char *skew, char *dir, size_t n) {
    const synthetic *s = NULL;
    for (size_t i = 0; i < sizeof synthetics / sizeof synthetics[0]; i++)
        if (!strcmp(synthetics[i].name, name)) s = &synthetics[i];
    if (!s) return cli_error(CMD, "unknown synthetic model '%s' (flash-2g, small, flash, pro)", name);
    if (skew) snprintf(dir, n, "/tmp/dsv4-synthetic-%s-skew%s", name, skew);
    else snprintf(dir, n, "/tmp/dsv4-synthetic-%s", name);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(cfg, &st) == 0) return 0;
    const char *sets[26];
    int n_sets = 0;
    while (s->sets[n_sets]) sets[n_sets] = s->sets[n_sets], n_sets++;
    char skew_set[64];
    if (skew) {
        snprintf(skew_set, sizeof skew_set, "dsv4_route_skew=%s", skew);
        sets[n_sets++] = skew_set;
    }
    fprintf(stderr, "writing synthetic model %s to %s (once)...\n", name, dir);
    dsv4_tiny_opts o = { .preset = "flash-tiny", .seed = 1, .sets = sets, .n_sets = n_sets, .n_shards = 4 };
    dsv4_error err;
    if (dsv4_tiny_write(dir, &o, &err)) return cli_fail(CMD, &err);
    return 0;
}

/* Expert parallelism: what each GPU holds and reads per decoded token. GPU 0 reads everything that is not a routed
 * expert; the routed reads are split by the experts each GPU holds (expert_place.h), as expected under uniform
 * routing (the tokens' real routing decides; this is the share, not a count). */
static void per_gpu_traffic(const dsv4_model *m, double tps, double bw) {
    const int n = cuda_gpus(m), E = m->cfg.n_routed;
    const double dense = (double)dsv4_fixed_weight_bytes(m), routed = (double)dsv4_decode_weight_bytes(m) - dense;
    printf("per GPU (routed-expert reads as expected under uniform routing):\n");
    for (int r = 0; r < n; r++) {
        const double share = (double)(expert_first(E, n, r + 1) - expert_first(E, n, r)) / E;
        const double b = (r ? 0 : dense) + routed * share;
        printf("  GPU %d: %7.2f GB held, %.3f GB read per token, %8.1f GB/s", r, cuda_gpu_weight_bytes(m, r) / 1e9, b / 1e9,
               b * tps / 1e9);
        if (bw > 0) printf(" = %5.1f %% of its measured bandwidth", 100.0 * b * tps / 1e9 / bw);
        printf("\n");
    }
}

/* The --json report: numbers set under a section object (created on first use); nothing when rep is NULL. */
static void rep_num(json_t *rep, const char *section, const char *key, double v) {
    if (!rep) return;
    json_t *o = json_object_get(rep, section);
    if (!o) json_object_set_new(rep, section, o = json_object());
    json_object_set_new(o, key, json_real(v));
}

/* Where a decode step's CPU time goes (backend/cpu/pool.h): the calling thread outside the parallel loops (serial
 * work: on a CUDA model, everything but its host experts' loops), its own share of the loops and its wait for the
 * slowest worker; how busy the workers were while loops ran, and how long a worker took to start on a loop. */
static void pool_report(dsv4_model *m, const dsv4_pool_stats *ps, int tokens, double wall, json_t *rep) {
    const double per = 1e3 / tokens, serial = wall - ps->in_run, own = ps->in_run - ps->caller_wait;
    const double busy = ps->worker_span > 0 ? ps->worker_busy / ps->worker_span : 0;
    const double wake_us = ps->worker_starts > 0 ? 1e6 * ps->worker_wake / (double)ps->worker_starts : 0;
    printf("%-26s %10.1f jobs/token  a token's calling thread: %.2f ms serial + %.2f ms its shares + %.2f ms waiting for "
           "workers; workers busy %.0f %% of the loops' time, %.1f us from a loop's start to theirs\n",
           "decode, CPU thread pool", (double)ps->jobs / tokens, serial * per, own * per, ps->caller_wait * per, 100 * busy,
           wake_us);
    rep_num(rep, "cpu_pool", "jobs_per_token", (double)ps->jobs / tokens);
    rep_num(rep, "cpu_pool", "serial_ms_per_token", serial * per);
    rep_num(rep, "cpu_pool", "caller_share_ms_per_token", own * per);
    rep_num(rep, "cpu_pool", "caller_wait_ms_per_token", ps->caller_wait * per);
    rep_num(rep, "cpu_pool", "worker_busy_fraction", busy);
    rep_num(rep, "cpu_pool", "worker_start_us", wake_us);
}

/* The bench's token sequence (any ids of the vocabulary: the weights are random). */
enum { VERIFY = 6 };   /* the speculative verify step's tokens: the pending one and 5 drafts */
static void bench_tokens(const dsv4_model *m, int32_t *tok, int n) {
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab_size);
}

/* Where the decode steps' routes went (issue 15), on a model with experts in host memory: the bench's prompt once
 * more in a fresh sequence, the routes of its `decode` steps counted (model/route_count.h) in this separate run, so
 * the counting kernel touches none of the timings, and set against the placement. */
static int route_share_report(dsv4_model *m, int prompt, int decode, json_t *rep) {
    const uint8_t *owner = cuda_expert_owners(m);
    if (!owner || decode < 1) return 0;
    dsv4_error err;
    dsv4_seq *s = NULL;
    expert_profile prof = { 0 };
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(prompt + decode));
    int rc = tok ? dsv4_seq_new(m, &s, &err) : dsv4_fail(&err, DSV4_E_NOMEM, "out of memory");
    if (!rc) {
        bench_tokens(m, tok, prompt + decode);
        dsv4_step_item it = { s, tok, prompt, DSV4_LOGITS_NONE, NULL };
        rc = dsv4_step(m, &it, 1, &err);
    }
    if (!rc) rc = model_count_routes(m, 1, &err);
    for (int i = 0; !rc && i < decode; i++) {
        dsv4_step_item d = { s, tok + prompt + i, 1, DSV4_LOGITS_NONE, NULL };
        rc = dsv4_step(m, &d, 1, &err);
    }
    if (!rc) rc = model_route_profile(m, &prof, &err);
    model_count_routes(m, 0, NULL);
    dsv4_seq_free(s);
    free(tok);
    if (rc) {
        expert_profile_free(&prof);
        return cli_fail(CMD, &err);
    }
    const expert_map map = { .n_layers = m->cfg.n_layers, .n_routed = m->cfg.n_routed, .owner = (uint8_t *)owner };
    double share[EXPERT_OWNERS], uniform[EXPERT_OWNERS];
    expert_map_route_shares(&map, prof.counts, share, uniform);
    expert_profile_free(&prof);
    printf("%-26s %10.1f %%      of %d decode steps' routes to experts in GPU memory, %.1f %% to the host's cores, %.1f %% "
           "over the bus (the experts themselves: %.1f / %.1f / %.1f %%)\n", "decode routes on the GPU", 100 * share[0], decode,
           100 * share[1], 100 * share[2], 100 * uniform[0], 100 * uniform[1], 100 * uniform[2]);
    rep_num(rep, "host_experts", "decode_route_share_gpu", share[0]);
    rep_num(rep, "host_experts", "decode_route_share_host", share[1]);
    rep_num(rep, "host_experts", "decode_route_share_bus", share[2]);
    return 0;
}

/* Prefill `prompt` tokens in steps of at most `chunk` (0: one step; chunked prefill gives the bits of one step), then
 * `decode` single-token steps; report both rates. A chunked prefill also reports its first and last step's rate:
 * the later chunks attend to (and index) everything before them, so their rate shows what a long context costs. */
/* --profile: the per-stage timing of the model's device (backend/cuda's, or core/profile.h's on the CPU). */
static void profile_on(dsv4_model *m, int on) {
    if (m->cuda) cuda_profile(m, on);
    else m->prof = (cpu_profile){ .on = on };
}

static void profile_report(const dsv4_model *m) {
    if (m->cuda) cuda_profile_report(m, stdout);
    else cpu_profile_report(&m->prof, stdout);
}

/* A CUDA model with experts in host memory (issue 15): how many, how many the GPU reads over the bus, and over the
 * whole run (prefill, decode, verify steps) the host's time computing and waiting for the routing, and the weight
 * bytes its kernels read (counted) over its computing time: the host's read bandwidth while it runs, against its
 * measured read bandwidth host_bw (<= 0: not measured). */
static void host_experts_report(const dsv4_model *m, double host_bw, json_t *rep) {
    cuda_host_work w;
    const int64_t n_host = cuda_host_experts(m, &w), n_bus = cuda_bus_experts(m), n_split = cuda_split_experts(m);
    if (n_host <= 0) return;
    int64_t n_planes = 0;   /* host experts in nibble planes (DSV4_CPU_FP4_PLANES, model/fp4_planes.h) */
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < m->cfg.n_routed; e++) n_planes += m->layers[l].w1[e].fmt == WF_FP4P;
    const double gbs = w.host_ms > 0 ? w.host_bytes / (w.host_ms * 1e6) : 0;
    printf("%-26s %10lld of %d   %lld read by the GPU over the bus, %lld split by token, %lld in nibble planes; host computing "
           "%.1f ms, waiting for routing %.1f ms over the run, %ld steps enqueued ahead (issue 15)\n", "experts in host memory",
           (long long)n_host, m->cfg.n_layers * m->cfg.n_routed, (long long)n_bus, (long long)n_split, (long long)n_planes, w.host_ms,
           w.wait_ms, w.ahead_steps);
    printf("%-26s %10.1f GB/s    %.2f GB of expert weights read by the host's kernels over its computing time", "host expert reads",
           gbs, w.host_bytes / 1e9);
    if (host_bw > 0) printf(", %.1f %% of the host's measured read bandwidth", 100 * gbs / host_bw);
    printf("\n");
    rep_num(rep, "host_experts", "experts", (double)n_host);
    rep_num(rep, "host_experts", "read_by_gpu_over_bus", (double)n_bus);
    rep_num(rep, "host_experts", "split_by_token", (double)n_split);
    rep_num(rep, "host_experts", "fp4_planes", (double)n_planes);
    rep_num(rep, "host_experts", "host_computing_ms", w.host_ms);
    rep_num(rep, "host_experts", "waiting_for_routing_ms", w.wait_ms);
    rep_num(rep, "host_experts", "steps_enqueued_ahead", (double)w.ahead_steps);
    rep_num(rep, "host_experts", "host_read_bytes", (double)w.host_bytes);
    rep_num(rep, "host_experts", "host_read_gb_s", gbs);
    if (host_bw > 0) rep_num(rep, "host_experts", "host_read_fraction", gbs / host_bw);
}

/* A CUDA model with experts in host memory: the host's time a decode token (w0, w1 taken around the decode steps),
 * computing its experts and waiting for the GPU's routing of each layer — with the step's launches (launched
 * directly) or the GPU's stretch between hand-offs (enqueued ahead: cuda_host_experts.h) in the wait. */
static void host_decode_report(const cuda_host_work *w0, const cuda_host_work *w1, int decode, json_t *rep) {
    const double host = (w1->host_ms - w0->host_ms) / decode, wait = (w1->wait_ms - w0->wait_ms) / decode;
    printf("%-26s %10.2f ms      computing the host's experts a token, %.2f ms waiting for the GPU's routing\n",
           "host, a decode token", host, wait);
    rep_num(rep, "host_experts", "decode_token_host_ms", host);
    rep_num(rep, "host_experts", "decode_token_wait_ms", wait);
}

/* Where the host's time goes in the decode steps run as CUDA graphs (cu_graph.h): g0 and g1 taken around them. A
 * step whose launches end long before its results (the wait) keeps the GPU fed; one that waits little was bound by
 * its own captures, edits and updates, the GPU idle between segments. */
static void graph_host_report(const cuda_graph_info *g0, const cuda_graph_info *g1, json_t *rep) {
    const long n = g1->graphed_steps - g0->graphed_steps;
    if (n <= 0) return;
    const cuda_graph_host_ms *a = &g0->host_ms, *b = &g1->host_ms;
    const double capture = (b->capture - a->capture) / n, edit = (b->edit - a->edit) / n, update = (b->update - a->update) / n,
                 launch = (b->launch - a->launch) / n, submit = (b->submit - a->submit) / n, wait = (b->wait - a->wait) / n;
    printf("%-26s %10.2f ms/step  submitting (capture %.2f, edges %.2f, update %.2f, launch %.2f), then %.2f ms waiting "
           "for the GPU\n", "host a graphed decode step", submit, capture, edit, update, launch, wait);
    rep_num(rep, "graph_host", "submit_ms", submit);
    rep_num(rep, "graph_host", "capture_ms", capture);
    rep_num(rep, "graph_host", "edit_ms", edit);
    rep_num(rep, "graph_host", "update_ms", update);
    rep_num(rep, "graph_host", "launch_ms", launch);
    rep_num(rep, "graph_host", "wait_ms", wait);
}

/* Prefill the prompt into s in steps of at most chunk tokens; with first_s / last_s, the time of the first and the
 * last step. */
static int prefill_steps(dsv4_model *m, dsv4_seq *s, const int32_t *tok, int prompt, int chunk, float *logits,
                         double *first_s, double *last_s, dsv4_error *err) {
    int rc = 0;
    for (int at = 0; !rc && at < prompt; at += chunk) {
        const double c0 = now_s();
        dsv4_step_item it = { s, tok + at, prompt - at < chunk ? prompt - at : chunk, DSV4_LOGITS_LAST, logits };
        rc = dsv4_step(m, &it, 1, err);
        if (last_s) *last_s = now_s() - c0;
        if (at == 0 && first_s && last_s) *first_s = *last_s;
    }
    return rc;
}

/* The prompt's prefill on a fresh sequence, untimed, the sequence then freed: the step's workspace grown and its
 * pages touched (and on the GPU its buffers allocated), as a server's are after its first request and as
 * llama-bench's warm-up run leaves llama.cpp's. */
static int warm_up_prefill(dsv4_model *m, const int32_t *tok, int prompt, int chunk, float *logits, dsv4_error *err) {
    dsv4_seq *w;
    if (dsv4_seq_new(m, &w, err)) return -1;
    const int rc = prefill_steps(m, w, tok, prompt, chunk, logits, NULL, NULL, err);
    dsv4_seq_free(w);
    return rc;
}

/* One speculative verify step on s: the pending token and 5 drafts (tok[0 .. VERIFY)), every row's logits into
 * vrows, then rolled back (all drafts rejected), so each one sees the same context. *secs (may be NULL): the step's
 * own time. routed (may be NULL): the step runs with its routing counted and *routed gets the weight bytes of the
 * distinct experts it chose (bench_step_routed_bytes). */
static int verify_step(dsv4_model *m, dsv4_seq *s, const int32_t *tok, float *vrows, double *secs, double *routed,
                       dsv4_error *err) {
    dsv4_seq_snapshot *snap = NULL;
    int rc = dsv4_seq_snapshot_new(s, &snap, err);
    if (rc) return rc;
    dsv4_step_item v = { s, tok, VERIFY, DSV4_LOGITS_ALL, vrows };
    const double v0 = now_s();
    rc = routed ? bench_step_routed_bytes(m, &v, 1, routed, err) : dsv4_step(m, &v, 1, err);
    if (secs) *secs = now_s() - v0;
    if (!rc) rc = dsv4_seq_rollback(s, snap, 0, err);
    dsv4_seq_snapshot_free(snap);
    return rc;
}

/* --kernel-trace (a CUDA model): TRACE_STEPS more decode steps and one verify step (rolled back) under a kernel
 * trace (cuda_backend.h cuda_trace_*), read per step as the GPU ran it: its span (first kernel's start to last
 * kernel's end), the time some kernel ran (the union of their intervals: branches overlap), the rest — no kernel
 * running, the gaps of the step's chain of dependent launches — and its kernels by their time. A step begins at its
 * embedding kernel (k_embed, cuda_step.c's first launch). */
enum { TRACE_STEPS = 8, TRACE_TOP = 14 };

typedef struct {
    const char *name;
    long n;
    uint64_t ns;
} trace_kernel;

static int span_by_start(const void *a, const void *b) {
    const cuda_kernel_span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}
static int kernel_by_time(const void *a, const void *b) {
    const trace_kernel *x = a, *y = b;
    return x->ns > y->ns ? -1 : x->ns < y->ns;
}

/* Steps [s0, s1) of the spans sorted by start, step st being spans [cut[st], cut[st + 1]): printed, and reported
 * under kernel_trace.key. */
static void trace_steps(const cuda_kernel_span *sp, const size_t *cut, int s0, int s1, const char *what, const char *key,
                        json_t *rep) {
    const int n_steps = s1 - s0;
    if (n_steps <= 0) return;
    uint64_t span = 0, busy = 0;
    size_t launches = 0;
    trace_kernel *k = NULL;
    int nk = 0, capk = 0;
    for (int st = s0; st < s1; st++) {
        uint64_t end = 0, first = sp[cut[st]].start, last = 0;
        for (size_t i = cut[st]; i < cut[st + 1]; i++) {
            const uint64_t a = sp[i].start > end ? sp[i].start : end;   /* the union: sorted by start */
            if (sp[i].end > a) busy += sp[i].end - a;
            if (sp[i].end > end) end = sp[i].end;
            if (sp[i].end > last) last = sp[i].end;
            int j = 0;
            while (j < nk && k[j].name != sp[i].name) j++;   /* names are interned: one pointer a kernel */
            if (j == nk) {
                if (nk == capk) {
                    trace_kernel *nkk = realloc(k, sizeof *k * (size_t)(capk = capk ? 2 * capk : 64));
                    if (!nkk) { free(k); return; }
                    k = nkk;
                }
                k[nk++] = (trace_kernel){ sp[i].name, 0, 0 };
            }
            k[j].n++;
            k[j].ns += sp[i].end - sp[i].start;
        }
        span += last - first;
        launches += cut[st + 1] - cut[st];
    }
    qsort(k, (size_t)nk, sizeof *k, kernel_by_time);
    uint64_t total = 0;   /* the kernels' own times (more than busy where branches overlap) */
    for (int j = 0; j < nk; j++) total += k[j].ns;
    const double per = 1.0 / n_steps, span_us = span * per / 1e3, busy_us = busy * per / 1e3, kernels = (double)launches * per;
    printf("%-26s %d %s: %.0f kernels a step, span %.1f us, a kernel running %.1f us (%.1f %%), none %.1f us (%.2f us a kernel)\n",
           "kernel trace (CUPTI)", n_steps, what, kernels, span_us, busy_us, 100.0 * busy_us / span_us, span_us - busy_us,
           (span_us - busy_us) / kernels);
    json_t *sec = rep ? json_object() : NULL, *arr = rep ? json_array() : NULL;
    for (int j = 0; j < nk && j < TRACE_TOP; j++) {
        printf("    %-32s %6.1f a step x %7.2f us = %8.1f us (%4.1f %% of the kernels' time)\n", k[j].name, k[j].n * per,
               k[j].ns / 1e3 / k[j].n, k[j].ns * per / 1e3, 100.0 * k[j].ns / (total ? (double)total : 1.0));
        if (arr) json_array_append_new(arr, json_pack("{s:s, s:f, s:f}", "name", k[j].name, "per_step", k[j].n * per, "us_each",
                                                      k[j].ns / 1e3 / k[j].n));
    }
    if (sec) {
        json_object_set_new(sec, "steps", json_integer(n_steps));
        json_object_set_new(sec, "kernels_per_step", json_real(kernels));
        json_object_set_new(sec, "span_us", json_real(span_us));
        json_object_set_new(sec, "busy_us", json_real(busy_us));
        json_object_set_new(sec, "idle_us", json_real(span_us - busy_us));
        json_object_set_new(sec, "kernels", arr);
        json_t *kt = json_object_get(rep, "kernel_trace");
        if (!kt) json_object_set_new(rep, "kernel_trace", kt = json_object());
        json_object_set_new(kt, key, sec);
    }
    free(k);
}

/* Every traced kernel as [name, start, end], ns from the first one's start, in order of start, under
 * kernel_trace.records: what happens between two given kernels (a hand-off, a launch gap) read offline. */
static void trace_records(const cuda_kernel_span *sp, size_t n, json_t *rep) {
    json_t *kt = json_object_get(rep, "kernel_trace"), *arr = json_array();
    if (!kt || !arr) {
        json_decref(arr);
        return;
    }
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("[s, I, I]", sp[i].name, (json_int_t)(sp[i].start - sp[0].start),
                                             (json_int_t)(sp[i].end - sp[0].start)));
    json_object_set_new(kt, "records", arr);
}

static int kernel_trace(dsv4_model *m, dsv4_seq *s, const int32_t *tok, int n_tok, float *logits, float *vrows, json_t *rep,
                        dsv4_error *err) {
    cuda_kernel_trace *t;
    int rc = cuda_trace_begin(&t, err);
    for (int i = 0; !rc && i < TRACE_STEPS; i++) {
        dsv4_step_item d = { s, tok + i % n_tok, 1, DSV4_LOGITS_LAST, logits };
        rc = dsv4_step(m, &d, 1, err);
    }
    if (!rc) rc = verify_step(m, s, tok, vrows, NULL, NULL, err);
    if (t) {
        const int end_rc = cuda_trace_end(t, err);
        if (!rc) rc = end_rc;
    }
    const cuda_kernel_span *spans;
    const size_t n = rc ? 0 : cuda_trace_spans(t, &spans);
    cuda_kernel_span *sp = n ? malloc(sizeof *sp * n) : NULL;
    size_t *cut = n ? malloc(sizeof *cut * (n + 1)) : NULL;
    if (n && (!sp || !cut)) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (!rc && n) {
        memcpy(sp, spans, sizeof *sp * n);
        qsort(sp, n, sizeof *sp, span_by_start);
        int steps = 0;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(sp[i].name, "k_embed")) cut[steps++] = i;   /* (cut holds n + 1) */
        cut[steps] = n;
        if (steps == TRACE_STEPS + 1) {
            trace_steps(sp, cut, 0, TRACE_STEPS, "decode steps", "decode", rep);
            trace_steps(sp, cut, TRACE_STEPS, TRACE_STEPS + 1, "verify step (6 tokens)", "verify", rep);
            if (rep) trace_records(sp, n, rep);
        } else
            printf("%-26s %zu kernels, %d embedding launches: not the %d steps traced (the steps could not be told apart)\n",
                   "kernel trace (CUPTI)", n, steps, TRACE_STEPS + 1);
    }
    free(sp);
    free(cut);
    cuda_trace_free(t);
    return rc;
}

static int bench_single_stream(dsv4_model *m, int prompt, int chunk, int decode, double bw, double host_bw, double peak,
                               int profile, int warmup, int trace, json_t *rep) {
    dsv4_error err;
    dsv4_seq *s;
    if (dsv4_seq_new(m, &s, &err)) return cli_fail(CMD, &err);
    /* the verify step reads the first VERIFY of them, however short the prompt and the decode */
    const int n_tok = prompt + decode > VERIFY ? prompt + decode : VERIFY;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_tok);
    float *logits = malloc(sizeof(float) * (size_t)m->cfg.vocab_size);
    if (!tok || !logits) { free(tok); free(logits); dsv4_seq_free(s); return cli_error(CMD, "out of memory"); }
    bench_tokens(m, tok, n_tok);
    if (chunk <= 0 || chunk > prompt) chunk = prompt;
    if (warmup && warm_up_prefill(m, tok, prompt, chunk, logits, &err)) {
        free(tok); free(logits); dsv4_seq_free(s);
        return cli_fail(CMD, &err);
    }
    if (profile) profile_on(m, 1);
    const int steps = (prompt + chunk - 1) / chunk;
    double t0 = now_s(), first_s = 0, last_s = 0;
    int rc = prefill_steps(m, s, tok, prompt, chunk, logits, &first_s, &last_s, &err);
    if (profile) {
        printf("prefill of %d tokens, ", prompt);
        profile_report(m);
        profile_on(m, 1);   /* then the decode steps */
    }
    cuda_graph_info g0, g1;
    cuda_graphs_get(m, &g0);
    cuda_host_work hw0, hw1;
    const int64_t n_host = m->cuda ? cuda_host_experts(m, &hw0) : 0;
    double t1 = now_s();
    dsv4_pool_count(m->pool, 1);
    for (int i = 0; !rc && i < decode; i++) {
        dsv4_step_item d = { s, tok + prompt + i, 1, DSV4_LOGITS_LAST, logits };
        rc = dsv4_step(m, &d, 1, &err);
    }
    double t2 = now_s();
    cuda_graphs_get(m, &g1);
    if (n_host > 0) cuda_host_experts(m, &hw1);
    dsv4_pool_stats ps;
    dsv4_pool_stats_get(m->pool, &ps);
    dsv4_pool_count(m->pool, 0);
    /* the speculative verify step (verify_step), timed reps times */
    const int reps = decode < 16 ? decode : 16;
    double tv = 0;
    float *vrows = rc ? NULL : malloc(sizeof(float) * (size_t)VERIFY * (size_t)m->cfg.vocab_size);
    if (!rc && !vrows) rc = dsv4_fail(&err, DSV4_E_NOMEM, "out of memory");
    const uint64_t routed0 = m->routed_bytes;
    for (int i = 0; !rc && i < reps; i++) {
        double secs = 0;
        rc = verify_step(m, s, tok, vrows, &secs, NULL, &err);
        tv += secs;
    }
    /* the verify step's weight bytes: the fixed ones and the distinct routed experts its tokens chose — more
     * experts than one token's, so more bytes (what bounds the step's ratio to a 1-token step from below). The CPU
     * counts them as it runs; a CUDA model (whose host-memory experts alone add to that count) in one more verify
     * step with the routing counted, rolled back too. */
    double vbytes = -1;
    if (!rc && reps > 0 && !m->cuda && m->routed_bytes != routed0)
        vbytes = (double)dsv4_fixed_weight_bytes(m) + (double)(m->routed_bytes - routed0) / reps;
    else if (!rc && reps > 0) {
        double counted = 0;
        if (!(rc = verify_step(m, s, tok, vrows, NULL, &counted, &err))) vbytes = (double)dsv4_fixed_weight_bytes(m) + counted;
    }
    if (rc) goto done;
    const double bytes = (double)dsv4_decode_weight_bytes(m), tps = decode / (t2 - t1);
    if (steps == 1)
        printf("%-26s %10.1f tok/s   (%d tokens in one step%s)\n", "prefill", prompt / (t1 - t0), prompt,
               warmup ? ", after a warm-up prefill" : "");
    else
        printf("%-26s %10.1f tok/s   (%d tokens in %d steps of %d; the first step %.1f tok/s, the last %.1f%s)\n",
               "prefill", prompt / (t1 - t0), prompt, steps, chunk, chunk / first_s, (prompt - (steps - 1) * chunk) / last_s,
               warmup ? "; after a warm-up prefill" : "");
    printf("%-26s %10.2f tok/s   %.1f ms/token\n", "decode, 1 stream", tps, 1e3 / tps);
    printf("%-26s %10.2f GB/s    %.3f GB weights read per token\n", "decode weight traffic", bytes * tps / 1e9, bytes / 1e9);
    if (bw > 0) printf("%-26s %10.1f %%      of measured read bandwidth\n", "bandwidth fraction", 100.0 * bytes * tps / 1e9 / bw);
    const double flops = (double)dsv4_token_linear_flops(m), pf_tps = prompt / (t1 - t0);
    if (peak > 0) {
        printf("%-26s %10.1f GFLOP/s %.3f GFLOP a token in the linears: %.1f %% of the multiply-add peak\n",
               "decode linear work", flops * tps / 1e9, flops / 1e9, 100.0 * flops * tps / 1e9 / peak);
        printf("%-26s %10.1f GFLOP/s %.1f %% of the multiply-add peak\n", "prefill linear work", flops * pf_tps / 1e9,
               100.0 * flops * pf_tps / 1e9 / peak);
    }
    if (cuda_gpus(m) > 1) per_gpu_traffic(m, tps, bw);
    if (decode > 0 && ps.jobs > 0) pool_report(m, &ps, decode, t2 - t1, rep);
    if (decode > 0 && n_host > 0) host_decode_report(&hw0, &hw1, decode, rep);
    graph_host_report(&g0, &g1, rep);
    rep_num(rep, "single_stream", "prompt_tokens", prompt);
    rep_num(rep, "single_stream", "prefill_tok_s", prompt / (t1 - t0));
    rep_num(rep, "single_stream", "prefill_steps", steps);
    rep_num(rep, "single_stream", "prefill_warmed_up", warmup);
    if (steps > 1) {
        rep_num(rep, "single_stream", "prefill_chunk_tokens", chunk);
        rep_num(rep, "single_stream", "prefill_first_step_tok_s", chunk / first_s);
        rep_num(rep, "single_stream", "prefill_last_step_tok_s", (prompt - (steps - 1) * chunk) / last_s);
    }
    rep_num(rep, "single_stream", "decode_tokens", decode);
    rep_num(rep, "single_stream", "decode_tok_s", tps);
    rep_num(rep, "single_stream", "decode_weight_gb_s", bytes * tps / 1e9);
    if (bw > 0) rep_num(rep, "single_stream", "bandwidth_fraction", bytes * tps / 1e9 / bw);
    rep_num(rep, "single_stream", "token_linear_flops", flops);
    if (peak > 0) {
        rep_num(rep, "single_stream", "decode_peak_fraction", flops * tps / 1e9 / peak);
        rep_num(rep, "single_stream", "prefill_peak_fraction", flops * pf_tps / 1e9 / peak);
    }
    if (reps > 0) {
        rep_num(rep, "single_stream", "verify_step_ms", 1e3 * tv / reps);
        rep_num(rep, "single_stream", "verify_step_vs_one_token", tv / reps * tps);
    }
    if (vbytes > 0) {
        rep_num(rep, "single_stream", "verify_step_weight_bytes", vbytes);
        rep_num(rep, "single_stream", "verify_step_bytes_vs_one_token", vbytes / bytes);
    }
    host_experts_report(m, host_bw, rep);
    if (reps > 0)
        printf("%-26s %10.2f ms/step  %.2fx a 1-token step (1 + 5 tokens, every row's logits, rolled back)\n",
               "speculative verify step", 1e3 * tv / reps, tv / reps * tps);
    if (vbytes > 0)
        printf("%-26s %10.3f GB/step  %.2fx a 1-token step's %.3f GB (its tokens' distinct routed experts)\n",
               "verify step weights", vbytes / 1e9, vbytes / bytes, bytes / 1e9);
    if (profile) {
        printf("decode, ");
        profile_report(m);
        profile_on(m, 0);
    }
    /* after the per-stage timing is off: the traced steps run as the timed ones did */
    if (trace) rc = kernel_trace(m, s, tok, n_tok, logits, vrows, rep, &err);
done:
    free(vrows);
    free(tok);
    free(logits);
    dsv4_seq_free(s);
    return rc ? cli_fail(CMD, &err) : 0;
}

/* Whether the steps ran as CUDA graphs (DSV4_CUDA_GRAPHS, cuda_backend.h): steps under --profile, with experts in
 * host memory or over several GPUs are launched directly even with graphs on. */
static void graphs_report(const dsv4_model *m, json_t *rep) {
    cuda_graph_info g;
    cuda_graphs_get(m, &g);
    printf("%-26s %10s   %ld steps as graphs, %ld launched directly (%ld instantiations, %ld updates, %.0f programmatic "
           "edges a capture)%s\n", "CUDA graphs", g.on ? "on" : "off", g.graphed_steps, g.direct_steps, g.instantiations,
           g.updates, g.captures ? (double)g.programmatic_edges / (double)g.captures : 0.0, g.on ? "" : ": DSV4_CUDA_GRAPHS=0");
    if (!rep) return;
    json_t *o = json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I}", "on", g.on, "graphed_steps", (json_int_t)g.graphed_steps,
                          "direct_steps", (json_int_t)g.direct_steps, "instantiations", (json_int_t)g.instantiations,
                          "updates", (json_int_t)g.updates, "captures", (json_int_t)g.captures, "programmatic_edges",
                          (json_int_t)g.programmatic_edges);
    if (o) json_object_set_new(rep, "cuda_graphs", o);
}

static void profile_start(dsv4_model *m, void *ctx) {
    (void)ctx;
    profile_on(m, 1);
}

/* --streams 1,2,4,...: aggregate decode tokens/s with N streams decoding together (weights read once a step). With
 * --profile, the decode steps of the last count once more, under the per-stage timing. */
static int bench_streams(dsv4_model *m, const char *list, int decode, double bw, double peak, int profile, json_t *rep) {
    int32_t *counts;
    int n;
    if (cli_parse_tokens(CMD, list, &counts, &n)) return 1;
    int *c = malloc(sizeof(int) * (size_t)n);
    if (!c) { free(counts); return cli_error(CMD, "out of memory"); }
    for (int i = 0; i < n; i++) {
        if (counts[i] < 1 || counts[i] > 4096) { free(counts); free(c); return cli_error(CMD, "--streams counts must be in 1..4096"); }
        c[i] = counts[i];
    }
    free(counts);
    dsv4_error err;
    printf("\n");
    dsv4_bench_streams_result *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) { free(c); return cli_error(CMD, "out of memory"); }
    int rc = dsv4_bench_streams_table(m, c, n, 16, decode, bw, peak, stdout, rows, &err);
    json_t *arr = rep && !rc ? json_array() : NULL;
    for (int i = 0; arr && i < n; i++)
        json_array_append_new(arr, json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "streams", rows[i].n_streams, "decode_steps",
                                             rows[i].decode_steps, "prefill_s", rows[i].prefill_s, "decode_tok_s", rows[i].decode_tok_s,
                                             "step_ms_mean", rows[i].step_ms_mean, "step_ms_max", rows[i].step_ms_max,
                                             "step_weight_bytes", rows[i].step_bytes, "step_linear_flops", rows[i].step_flops));
    if (arr) json_object_set_new(rep, "streams", arr);
    if (!rc && profile) {
        dsv4_bench_streams_result r;
        printf("\nper-stage time of %d-stream decode steps%s:\n", c[n - 1], m->cuda ? " (synchronised stages, launched directly)" : "");
        rc = dsv4_bench_streams_hooked(m, c[n - 1], 16, decode, profile_start, NULL, &r, &err);
        if (!rc) profile_report(m);
        profile_on(m, 0);
    }
    free(rows);
    free(c);
    return rc ? cli_fail(CMD, &err) : 0;
}

/* --context 4096,131072,...: single-stream decode after a context of N tokens. Prefilling 1M tokens to measure
 * this would take longer than the decode it measures, so the sequence jumps there with all-zero rows
 * (seq_fast_forward_zero: the counts, capacities and bytes read of N real tokens, none of their values). */
static int bench_context(dsv4_model *m, const char *list, int decode, int profile, json_t *rep) {
    int32_t *ctx;
    int n;
    if (cli_parse_tokens(CMD, list, &ctx, &n)) return 1;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)decode);
    float *logits = malloc(sizeof(float) * (size_t)m->cfg.vocab_size);
    json_t *arr = rep ? json_array() : NULL;
    int rc = tok && logits ? 0 : cli_error(CMD, "out of memory");
    if (!rc) printf("\n %10s %12s %10s   (single stream after a context of zero rows, %d decode steps)\n", "context",
                    "decode tok/s", "ms/token", decode);
    for (int i = 0; i < decode && tok; i++) tok[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab_size);
    for (int k = 0; k < n && !rc; k++) {
        if (ctx[k] < 0) { rc = cli_error(CMD, "--context lengths must be >= 0"); break; }
        /* the decode steps need room: a context at the model's maximum (1M for V4) starts `decode` rows short */
        const int64_t room = m->cfg.max_position - decode;
        if (room < 0) { rc = cli_error(CMD, "--decode %d exceeds the model's maximum of %lld positions", decode, (long long)m->cfg.max_position); break; }
        const int64_t start = ctx[k] > room ? room : ctx[k];
        dsv4_error err = { 0 };
        dsv4_seq *s = NULL;
        if (dsv4_seq_new(m, &s, &err) || seq_fast_forward_zero(s, start, &err) || seq_reserve(s, decode)) {
            dsv4_seq_free(s);
            rc = err.code ? cli_fail(CMD, &err) : cli_error(CMD, "out of memory for a %d-token context", (int)ctx[k]);
            break;
        }
        /* one untimed step first: it grows the step's scratch to this context */
        dsv4_step_item w = { s, tok, 1, DSV4_LOGITS_LAST, logits };
        rc = dsv4_step(m, &w, 1, &err);
        if (profile) profile_on(m, 1);
        const double t0 = now_s();
        for (int i = 1; !rc && i < decode; i++) {
            dsv4_step_item d = { s, tok + i, 1, DSV4_LOGITS_LAST, logits };
            rc = dsv4_step(m, &d, 1, &err);
        }
        const double dt = now_s() - t0;
        dsv4_seq_free(s);
        if (rc) { rc = cli_fail(CMD, &err); break; }
        const double tps = decode > 1 ? (decode - 1) / dt : 0;
        printf(" %10d %12.2f %10.2f", (int)ctx[k], tps, tps > 0 ? 1e3 / tps : 0.0);
        if (start < ctx[k]) printf("   (from position %lld: the model's maximum is %lld)", (long long)start, (long long)m->cfg.max_position);
        printf("\n");
        if (profile) {
            printf("   decode at this context, ");
            profile_report(m);
            profile_on(m, 0);
        }
        if (arr) json_array_append_new(arr, json_pack("{s:i, s:I, s:f}", "context", (int)ctx[k], "start", (json_int_t)start, "decode_tok_s", tps));
    }
    if (arr) json_object_set_new(rep, "context", arr);
    free(ctx);
    free(tok);
    free(logits);
    return rc;
}

/* --spec ngram,mtp,...: greedy generation of n tokens from a fixed prompt with each drafter, against plain
 * decoding of the same tokens: acceptance, tokens per target step, tokens/s. */
static int bench_spec(dsv4_model *m, const char *list, int n) {
    if (n < 8) n = 64;
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab_size);
    const dsv4_sampling sp = { .temperature = 0.0f, .top_p = 1.0f };
    printf("\n %-8s %6s %10s %10s %12s %10s\n", "drafter", "draft", "accepted", "tok/step", "decode tok/s", "vs none");
    double base = 0;
    char *names = strdup(list), *save = NULL;
    if (!names) return cli_error(CMD, "out of memory");
    int rc = 0;
    for (char *name = strtok_r(names, ",", &save); name && !rc; name = strtok_r(NULL, ",", &save)) {
        const int none = !strcmp(name, "none");
        dsv4_drafter dr = {0};
        dsv4_error err;
        if (none) rc = dsv4_drafter_external(m->cfg.vocab_size, &dr, &err);   /* proposes nothing: plain decoding */
        else if (!strcmp(name, "ngram")) rc = dsv4_drafter_ngram(1, 4, &dr, &err);
        else if (!strcmp(name, "self")) rc = dsv4_drafter_self(m, &sp, &dr, &err);
        else if (!strcmp(name, "mtp")) rc = dsv4_drafter_mtp(m, &sp, &dr, &err);
        else if (!strcmp(name, "dspark")) rc = dsv4_drafter_dspark(m, &sp, &dr, &err);
        else { rc = cli_error(CMD, "--spec: unknown drafter '%s' (none, ngram, self, mtp, dspark)", name); break; }
        if (rc) { rc = cli_fail(CMD, &err); break; }
        const int draft = !strcmp(name, "mtp") ? 1 : !strcmp(name, "dspark") ? m->cfg.dspark_block_size : 4;
        dsv4_spec_opts o = { .draft = draft, .max_new_tokens = n };
        dsv4_spec_stream *st;
        if ((rc = dsv4_spec_stream_new(m, prompt, 16, &sp, &o, &dr, &st, &err))) { rc = cli_fail(CMD, &err); break; }
        const double t0 = now_s();
        while (!rc && !dsv4_spec_stream_done(st)) rc = dsv4_spec_step(m, &st, 1, &err);
        const double dt = now_s() - t0;
        if (rc) { dsv4_spec_stream_free(st); rc = cli_fail(CMD, &err); break; }
        dsv4_spec_stats ss;
        dsv4_spec_stream_stats(st, &ss);
        dsv4_spec_stream_free(st);
        const double tps = ss.emitted / dt;
        if (none) base = tps;
        char rel[32] = "-";
        if (base > 0 && !none) snprintf(rel, sizeof rel, "%.2fx", tps / base);
        printf(" %-8s %6d %9.1f%% %10.2f %12.2f %10s\n", name, none ? 0 : draft,
               ss.proposed ? 100.0 * ss.accepted / ss.proposed : 0.0, (double)ss.emitted / ss.steps, tps, rel);
    }
    free(names);
    return rc;
}

/* --spec with --streams: the continuous-batching scheduler (what `dsv4 serve --spec` runs) with N greedy
 * streams of n tokens each, every one speculating with the drafter (none: plain decoding): acceptance, target
 * tokens per step and stream, aggregate tokens/s against the same streams without speculation. Each stream
 * has its own 16-token prompt; the time covers prompts and decoding (prompts are a small share at n >= 64). */
static int bench_spec_streams(dsv4_model *m, const char *list, const char *counts_list, int n) {
    if (n < 8) n = 64;
    int32_t *counts;
    int n_counts;
    if (cli_parse_tokens(CMD, counts_list, &counts, &n_counts)) return 1;
    for (int i = 0; i < n_counts; i++)
        if (counts[i] < 1 || counts[i] > 4096) { free(counts); return cli_error(CMD, "--streams counts must be in 1..4096"); }
    printf("\n %-8s %7s %6s %10s %10s %12s %10s   (scheduler, greedy, %d tokens per stream)\n", "drafter", "streams",
           "draft", "accepted", "tok/step", "tok/s", "vs none", n);
    int rc = 0;
    for (int ci = 0; ci < n_counts && !rc; ci++) {
        const int N = counts[ci];
        double base = 0;
        char *names = strdup(list), *save = NULL;
        if (!names) { rc = cli_error(CMD, "out of memory"); break; }
        for (char *name = strtok_r(names, ",", &save); name && !rc; name = strtok_r(NULL, ",", &save)) {
            const int none = !strcmp(name, "none");
            if (!none && !dsv4_drafter_name_known(name)) { rc = cli_error(CMD, "--spec: unknown drafter '%s' (none, ngram, self, mtp, dspark)", name); break; }
            dsv4_error err;
            dsv4_sched *s;
            const dsv4_sched_opts so = { N, 0 };
            if (dsv4_sched_new(m, &so, &s, &err)) { rc = cli_fail(CMD, &err); break; }
            int32_t *prompts = malloc(sizeof(int32_t) * 16 * (size_t)N);
            int64_t *ids = malloc(sizeof(int64_t) * (size_t)N);
            if (!prompts || !ids) { free(prompts); free(ids); dsv4_sched_free(s); rc = cli_error(CMD, "out of memory"); break; }
            for (int k = 0; k < N; k++) {
                for (int i = 0; i < 16; i++) prompts[16 * k + i] = (int32_t)(((i + 31 * k) * 7919 + 13) % m->cfg.vocab_size);
                dsv4_request r = { .prompt = prompts + 16 * k, .n_prompt = 16, .sampling = { 0.0f, 0, 1.0f, 0.0f, (uint64_t)k },
                                   .max_new_tokens = n };
                if (!none) r.spec = (dsv4_sched_spec){ dsv4_drafter_named_make, name, dsv4_drafter_default_draft(name, m), 0.0f };
                if ((rc = dsv4_sched_add(s, &r, &ids[k], &err))) break;
            }
            const double t0 = now_s();
            long long steps = 0;
            while (!rc && dsv4_sched_pending(s)) { rc = dsv4_sched_step(s, &err); steps++; }
            const double dt = now_s() - t0;
            int64_t drafted = 0, accepted = 0, spec_steps = 0, emitted = 0, errors = 0;
            for (int k = 0; k < N && !rc; k++) {
                dsv4_req_result res;
                if ((rc = dsv4_sched_result(s, ids[k], &res, &err))) break;
                drafted += res.spec_drafted;
                accepted += res.spec_accepted;
                spec_steps += res.spec_steps;
                emitted += res.n_tokens;
                errors += res.finish == DSV4_FINISH_ERROR;
            }
            free(prompts);
            free(ids);
            dsv4_sched_free(s);
            if (rc) { rc = cli_fail(CMD, &err); break; }
            /* a drafter that cannot be made (no head in this checkpoint) fails every request */
            if (errors) { rc = cli_error(CMD, "--spec %s: the scheduler could not speculate with it (does the checkpoint have its head?)", name); break; }
            const double tps = emitted / dt;
            if (none) base = tps;
            char rel[32] = "-";
            if (base > 0 && !none) snprintf(rel, sizeof rel, "%.2fx", tps / base);
            printf(" %-8s %7d %6d %9.1f%% %10.2f %12.2f %10s\n", name, N, none ? 0 : dsv4_drafter_default_draft(name, m),
                   drafted ? 100.0 * (double)accepted / (double)drafted : 0.0,
                   spec_steps ? (double)emitted / (double)spec_steps : (double)emitted / (double)(N ? steps : 1) / N, tps, rel);
        }
        free(names);
    }
    free(counts);
    return rc;
}

static int bench_tokenizer(const char *dir) {
    dsv4_tokenizer *t;
    dsv4_error err;
    if (dsv4_tokenizer_load_dir(dir, &t, &err)) return cli_fail(CMD, &err);
    size_t n;
    char *corpus = dsv4_tokenizer_bench_corpus(8u << 20, &n);
    double mbps = corpus ? dsv4_tokenizer_bench_mbps(t, corpus, n, 3, &err) : -1;
    free(corpus);
    dsv4_tokenizer_free(t);
    if (mbps < 0) return cli_error(CMD, "tokenizer benchmark failed");
    printf("%-26s %10.1f MB/s    (%.1f MB mixed corpus)\n", "tokenizer encode", mbps, n / 1e6);
    return 0;
}

/* Constrained decoding on the folder's tokenizer: compile times and per-token mask times (constraint_bench.h). */
static int bench_grammar(const char *dir, int device) {
    dsv4_tokenizer *t;
    dsv4_error err;
    if (dsv4_tokenizer_load_dir(dir, &t, &err)) return cli_fail(CMD, &err);
    int rc = dsv4_constraint_bench(t, stdout, &err);
    /* a folder that is also a checkpoint: the overhead on its batched decode step */
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (!rc && access(cfg, R_OK) == 0) {
        dsv4_load_opts lo = { .mode = DSV4_MODE_EXACT, .quiet = 1, .kv_format = DSV4_KV_F32, .device = device };
        dsv4_model *m;
        if (!(rc = dsv4_model_load(dir, &lo, &m, &err))) {
            rc = dsv4_constraint_bench_overhead(m, t, stdout, &err);
            dsv4_model_free(m);
        }
    }
    dsv4_tokenizer_free(t);
    return rc ? cli_fail(CMD, &err) : 0;
}

int cmd_bench(int argc, char **argv) {
    const char *model_dir = NULL, *synth = NULL, *skew = NULL, *streams = NULL, *spec = NULL, *isa = NULL, *json_path = NULL, *context = NULL;
    long long threads = 0, prompt = 128, decode = 32, chunk = 0;
    int tokenizer = 0, grammar = 0, no_bw = 0, profile = 0, warmup = 0, trace = 0, kv = DSV4_KV_F32, device = DSV4_DEVICE_CPU, gpus = 1;
    dsv4_mode mode = DSV4_MODE_EXACT;
    cli_placement place = { 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; model_dir = v; }
        else if (!strcmp(a, "--synthetic")) { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; synth = v; }
        else if (!strcmp(a, "--route-skew")) {
            if (!(v = cli_value(CMD, argc, argv, &i))) return 1;
            char *end = NULL;
            const double f = strtod(v, &end);
            if (end == v || *end || !(f > 0 && f <= 10) || strlen(v) > 16 || strspn(v, "0123456789.") != strlen(v))
                return cli_error(CMD, "--route-skew must be a number above 0 and at most 10 (for example 0.1), got '%s'", v);
            skew = v;
        }
        else if (!strcmp(a, "--threads")) { if (!(v = cli_value(CMD, argc, argv, &i)) || cli_parse_int(CMD, a, v, 0, 1024, &threads)) return 1; }
        else if (!strcmp(a, "--prompt")) { if (!(v = cli_value(CMD, argc, argv, &i)) || cli_parse_int(CMD, a, v, 1, 1 << 20, &prompt)) return 1; }
        else if (!strcmp(a, "--prefill-chunk")) { if (!(v = cli_value(CMD, argc, argv, &i)) || cli_parse_int(CMD, a, v, 1, 1 << 20, &chunk)) return 1; }
        else if (!strcmp(a, "--decode")) { if (!(v = cli_value(CMD, argc, argv, &i)) || cli_parse_int(CMD, a, v, 1, 1 << 20, &decode)) return 1; }
        else if (!strcmp(a, "--kv")) {
            if (!(v = cli_value(CMD, argc, argv, &i))) return 1;
            if ((kv = kv_format_parse(v)) < 0) return cli_error(CMD, "--kv must be f32, bf16 or fp8, got '%s'", v);
        }
        else if (!strcmp(a, "--tokenizer")) tokenizer = 1;
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--warmup")) warmup = 1;
        else if (!strcmp(a, "--kernel-trace")) trace = 1;
        else if (!strcmp(a, "--isa")) { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; isa = v; }
        else if (!strcmp(a, "--grammar")) grammar = 1;
        else if (!strcmp(a, "--device")) { if (!(v = cli_value(CMD, argc, argv, &i)) || cli_parse_device(CMD, v, &device)) return 1; }
        else if (!strcmp(a, "--gpus")) { if (!(v = cli_value(CMD, argc, argv, &i)) || cli_parse_gpus(CMD, v, &gpus)) return 1; }
        else if ((r = cli_placement_option(CMD, argc, argv, &i, &place)) != 0) { if (r < 0) return 1; }
        else if (cli_amx_option(a, &place)) continue;
        else if (!strcmp(a, "--mode")) { if (!(v = cli_value(CMD, argc, argv, &i)) || cli_parse_mode(CMD, v, &mode)) return 1; }
        else if (!strcmp(a, "--no-bandwidth")) no_bw = 1;
        else if (!strcmp(a, "--streams")) { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; streams = v; }
        else if (!strcmp(a, "--spec")) { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; spec = v; }
        else if (!strcmp(a, "--json")) { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; json_path = v; }
        else if (!strcmp(a, "--context")) { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; context = v; }
        else return cli_error(CMD, "unknown option '%s'", a);
    }
    if (!model_dir == !synth) return cli_error(CMD, "give exactly one of -m DIR and --synthetic NAME");
    if (skew && !synth) return cli_error(CMD, "--route-skew needs --synthetic NAME (it makes the synthetic model's routing skewed)");
    if (trace && device != DSV4_DEVICE_CUDA) return cli_error(CMD, "--kernel-trace traces the GPU's kernels: it needs --device cuda");
    char dir[512];
    if (synth) {
        if (synthetic_dir(synth, skew, dir, sizeof dir)) return 1;
        model_dir = dir;
    }
    if (tokenizer) return bench_tokenizer(model_dir);
    if (grammar) return bench_grammar(model_dir, device);
    dsv4_load_opts lo = { .mode = mode, .n_threads = (int)threads, .quiet = 1, .kv_format = kv, .device = device, .n_gpus = gpus,
                          .cpu_isa = isa };
    cli_placement_apply(&place, &lo);
    dsv4_model *m;
    dsv4_error err;
    if (dsv4_model_load(model_dir, &lo, &m, &err)) return cli_fail(CMD, &err);
    cuda_graph_info graphs;
    cuda_graphs_get(m, &graphs);
    printf("model %s: %d layers, hidden %d, %.2f GB weights, %.3f GB read per decoded token, %d threads, %s mode, "
           "%s kernels%s%s%s%s%s\n",
           model_dir, m->cfg.n_layers, m->cfg.dim, dsv4_total_weight_bytes(m) / 1e9, dsv4_decode_weight_bytes(m) / 1e9,
           dsv4_pool_threads(m->pool), mode == DSV4_MODE_OFFICIAL ? "official" : "exact",
           m->device == DSV4_DEVICE_CPU ? dsv4_pool_kernels(m->pool)->name : "cuda", m->dots == CPU_DOTS_AMX ? " (AMX linears)" : m->dots == CPU_DOTS_PAIRS ? " (bf16 pair dots)" : "",
           !m->cuda ? "" : graphs.on ? ", CUDA graphs on" : ", CUDA graphs off (DSV4_CUDA_GRAPHS=0)",
           !m->cuda || mode != DSV4_MODE_OFFICIAL ? "" : cuda_mma_on(m) ? ", FP8 tensor cores" : ", FP8 tensor cores off (DSV4_CUDA_MMA=0)",
           m->device == DSV4_DEVICE_CPU ? ", weights: " : "", m->device == DSV4_DEVICE_CPU ? st_memory_words(m->weight_memory) : "");
    if (m->cfg.synthetic_holes && m->cuda)
        printf("synthetic weights generated in GPU memory: %d distinct layer weight sets for %d layers%s\n",
               cuda_distinct_layers(m), m->cfg.n_layers,
               cuda_distinct_layers(m) < m->cfg.n_layers ? " (the later layers reuse an earlier layer's weights of their kind)" : "");
    if (!m->cuda) {   /* DSV4_CPU_FP4_PLANES=1 (model/fp4_planes.h): how many routed expert weights took the layout */
        const long planes = fp4_planes_routed(m);
        if (planes) printf("routed experts in nibble planes: %ld of %d weights (DSV4_CPU_FP4_PLANES=1)\n", planes,
                           3 * m->cfg.n_layers * m->cfg.n_routed);
    }
    if (m->cfg.synthetic_holes && !m->cuda)
        printf("synthetic weights generated in host memory: %.2f GiB; %lld of %lld routed-expert tensors with bytes of their own%s\n",
               m->synth.bytes / 1073741824.0, (long long)m->synth.expert_own, (long long)m->synth.expert_tensors,
               m->synth.expert_own < m->synth.expert_tensors ? ", the others share them in a cycle" : "");
    kv_cost_report(stdout, "", kv, m->cfg.n_layers, m->cfg.compress_ratio, m->cfg.head_dim, m->cfg.rope_dim,
                   m->cfg.index_head_dim, m->cfg.window);
    double bw = -1, host_bw = -1;   /* host_bw: the host's, where it computes experts of a CUDA model */
    if (!no_bw && m->cuda) {
        bw = cuda_copy_bandwidth_gbs(m);
        printf("%-26s %10.1f GB/s    (GPU copy of 2 GiB, read + write, best of 5)\n", "device memory bandwidth", bw);
    }
    if (!no_bw && (!m->cuda || cuda_host_experts(m, NULL) > cuda_bus_experts(m))) {
        host_bw = cpu_read_bandwidth_gbs(m->pool, (size_t)1 << 31, 3);
        printf("%-26s %10.1f GB/s    (2 GiB read, best of 3)\n", m->cuda ? "host memory read bandwidth" : "memory read bandwidth",
               host_bw);
        if (!m->cuda) bw = host_bw;
    }
    /* a CPU model's linears against the arithmetic they spend (AMX's tiles are not what peak.h runs: not measured) */
    double peak = -1;
    if (!no_bw && !m->cuda && m->dots != CPU_DOTS_AMX) {
        const int bf16 = m->dots == CPU_DOTS_PAIRS;
        peak = cpu_peak_gflops(m->pool, bf16, 3);
        if (peak > 0)
            printf("%-26s %10.1f GFLOP/s (%s on %d threads, registers only, best of 3)\n", "multiply-add peak", peak,
                   bf16 && !strcmp(dsv4_pool_kernels(m->pool)->name, "avx512bf16") ? "VDPBF16PS" : "the kernel set's fp32 multiply-add",
                   dsv4_pool_width(m->pool));
    }
    json_t *rep = json_path ? json_object() : NULL;
    if (rep) {
        json_object_set_new(rep, "model", json_pack("{s:s, s:i, s:i, s:f, s:f, s:s, s:s, s:i, s:i}", "dir", model_dir, "layers",
                                                    m->cfg.n_layers, "hidden", m->cfg.dim, "weight_bytes",
                                                    (double)dsv4_total_weight_bytes(m), "decode_bytes_per_token",
                                                    (double)dsv4_decode_weight_bytes(m), "mode",
                                                    mode == DSV4_MODE_OFFICIAL ? "official" : "exact", "kernels",
                                                    m->device == DSV4_DEVICE_CPU ? dsv4_pool_kernels(m->pool)->name : "cuda",
                                                    "threads", dsv4_pool_threads(m->pool), "gpus", m->cuda ? cuda_gpus(m) : 0));
        if (!m->cuda) json_object_set_new(json_object_get(rep, "model"), "weight_memory",
                                          json_string(st_memory_name(m->weight_memory)));
        if (m->cuda) json_object_set_new(json_object_get(rep, "model"), "cuda_graphs", json_boolean(graphs.on));
        if (m->cuda) json_object_set_new(json_object_get(rep, "model"), "cuda_tensor_cores",
                                         json_boolean(mode == DSV4_MODE_OFFICIAL && cuda_mma_on(m)));
        if (m->cfg.synthetic_holes && m->cuda) json_object_set_new(json_object_get(rep, "model"), "distinct_layer_weight_sets",
                                                                   json_integer(cuda_distinct_layers(m)));
        if (m->cfg.synthetic_holes && !m->cuda) {
            json_object_set_new(json_object_get(rep, "model"), "synthetic_expert_tensors", json_integer(m->synth.expert_tensors));
            json_object_set_new(json_object_get(rep, "model"), "synthetic_expert_tensors_own", json_integer(m->synth.expert_own));
        }
        if (bw > 0 && m->cuda) rep_num(rep, "machine", "device_copy_gb_s", bw);
        if (host_bw > 0) rep_num(rep, "machine", "memory_read_gb_s", host_bw);
        if (peak > 0) rep_num(rep, "machine", "multiply_add_peak_gflop_s", peak);
    }
    int rc = bench_single_stream(m, (int)prompt, (int)chunk, (int)decode, bw, host_bw, peak, profile, warmup, trace, rep);
    if (!rc) rc = route_share_report(m, (int)prompt, (int)decode, rep);
    if (!rc && streams) rc = bench_streams(m, streams, (int)decode, bw, peak, profile, rep);
    if (!rc && context) rc = bench_context(m, context, (int)decode, profile, rep);
    if (!rc && spec) rc = bench_spec(m, spec, (int)decode);
    if (!rc && spec && streams) rc = bench_spec_streams(m, spec, streams, (int)decode);
    if (!rc && m->cuda) graphs_report(m, rep);
    dsv4_model_free(m);
    if (rep && !rc && json_dump_file(rep, json_path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(6)))
        rc = cli_error(CMD, "cannot write the JSON report to %s", json_path);
    json_decref(rep);
    return rc;
}
