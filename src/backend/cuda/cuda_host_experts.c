/* Routed experts in host memory: the three steps of cuda_host_experts.h. */
#ifdef DSV4_CUDA
#include "backend/cuda/cuda_host_experts.h"
#include "model/model.h"
#include "backend/cpu/isa.h"
#include "model/footprint.h"
#include "model/fp4_planes.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "util/bigmem.h"
#include "util/error.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int cuda_hx_init(cu_host_experts *hx, expert_map *map, dsv4_error *err) {
    memset(hx, 0, sizeof *hx);
    hx->map = *map;
    memset(map, 0, sizeof *map);
    const size_t LE = (size_t)hx->map.n_layers * (size_t)hx->map.n_routed;
    if (!(hx->n_host = calloc((size_t)hx->map.n_layers, sizeof *hx->n_host)) || !(hx->bus_shared = calloc(LE + 1, 1)) ||
        !(hx->fetched = cu_event_new()) || !(hx->ahead_layers = calloc((size_t)hx->map.n_layers + 1, sizeof *hx->ahead_layers)) ||
        !(hx->link = cu_malloc_mapped(sizeof *hx->link)) || !(hx->blocks_done = cu_malloc(4 * sizeof *hx->blocks_done)) ||
        cu_zero(hx->blocks_done, 4 * sizeof *hx->blocks_done)) {
        cuda_hx_free(hx);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory (host experts)");
    }
    for (int l = 0; l < hx->map.n_layers; l++) {
        for (int e = 0; e < hx->map.n_routed; e++) {
            const int o = expert_owner_of(&hx->map, l, e);
            hx->n_host[l] += o == EXPERT_ON_HOST || o == EXPERT_ON_SPLIT;
        }
        if (hx->n_host[l]) hx->ahead_layers[hx->n_ahead++] = l;   /* the layers a step enqueued ahead hands off */
    }
    hx->fail_at = -1;
    /* the token split's tiles (cu_moe_split_tiles) read the owners on the GPU */
    if (hx->map.n_split && (!(hx->owner_d = cu_malloc(LE)) || cu_upload(hx->owner_d, hx->map.owner, LE))) {
        cuda_hx_free(hx);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory (host experts' owners)");
    }
    return DSV4_OK;
}

static void free_buffers(cu_host_experts *hx) {
    moe_host_scratch_free(&hx->scr);
    cu_free_host(hx->xn_h);
    cu_free_host(hx->route_w_h);
    cu_free_host(hx->rows_h);
    cu_free_host(hx->route_e_h);
    cu_free_host(hx->pair_h);
    cu_free(hx->rows_d);
    cu_free(hx->pair_d);
    hx->xn_h = hx->route_w_h = hx->rows_h = hx->rows_d = NULL;
    hx->route_e_h = hx->pair_h = hx->pair_d = NULL;
    hx->T_cap = 0;
}

void cuda_hx_free(cu_host_experts *hx) {
    free_buffers(hx);
    bigmem_free(hx->arena, hx->arena_bytes);
    if (hx->map.n_split) {   /* the split experts' arena: huge pages, registered (arena_pin) */
        cu_host_unregister(hx->bus_arena);
        bigmem_free(hx->bus_arena, hx->bus_bytes);
    } else
        cu_free_host(hx->bus_arena);
    cu_free(hx->owner_d);
    cu_event_free(hx->fetched);
    cu_free_host(hx->link);
    cu_free(hx->blocks_done);
    free(hx->ahead_layers);
    free(hx->n_host);
    free(hx->bus_shared);
    expert_map_free(&hx->map);
    memset(hx, 0, sizeof *hx);
}

/* ---- where the host experts' bytes live ---- */

/* One weight's data or scale bytes of a host expert: copied from src, or (src NULL, synthetic) filled from seed. */
typedef struct {
    const void *src;
    size_t off, n;   /* its place in the arena */
    int fmt, scale;
    uint64_t seed;
    int planes_cols;   /* FP4 data to repack into nibble planes after the fill (model/fp4_planes.h): its columns, else 0 */
} hx_piece;

typedef struct {
    hx_piece *p;
    int n;
    size_t bytes;   /* the arena's size: every piece at a 64-byte boundary */
} hx_pieces;

static size_t add_piece(hx_pieces *ps, const void *src, size_t n, int fmt, int scale, uint64_t seed, int planes_cols) {
    hx_piece *pc = &ps->p[ps->n++];
    *pc = (hx_piece){ src, ps->bytes, n, fmt, scale, seed, planes_cols };
    ps->bytes += (n + 63) / 64 * 64;
    return pc->off;
}

typedef struct {
    const hx_pieces *ps;
    uint8_t *arena;
} hx_fill_job;

static void fill_pieces(void *ctx, int begin, int end, int thread) {
    (void)thread;
    const hx_fill_job *j = ctx;
    for (int i = begin; i < end; i++) {
        const hx_piece *pc = &j->ps->p[i];
        if (pc->src) memcpy(j->arena + pc->off, pc->src, pc->n);
        else synth_fill(j->arena + pc->off, 0, pc->n, pc->scale ? 0 : pc->fmt == WF_FP8 ? SYNTH_FP8 : SYNTH_FP4, pc->seed);
        if (pc->planes_cols)
            for (size_t r = 0; r < pc->n; r += (size_t)pc->planes_cols / 2) fp4_planes_pack_row(j->arena + pc->off + r, pc->planes_cols);
    }
}

static dsv4_weight *expert_weight(struct dsv4_model *m, int l, int e, int k) {
    dsv4_layer *ly = &m->layers[l];
    return k == 0 ? &ly->w1[e] : k == 1 ? &ly->w2[e] : &ly->w3[e];
}

/* Expert (l, e)'s bindings moved into the arena: its pieces start at ps->p[*i], in add order (w1, w2, w3; each
 * data then scale); *i moves past them. A piece repacked into planes makes its weight WF_FP4P. */
static void repoint_expert(uint8_t *arena, struct dsv4_model *m, int l, int e, const hx_pieces *ps, int *i) {
    for (int k = 0; k < 3; k++) {
        dsv4_weight *w = expert_weight(m, l, e, k);
        if (ps->p[*i].planes_cols) w->fmt = WF_FP4P;
        w->data = arena + ps->p[(*i)++].off;
        if (weight_scale_bytes(w)) w->scale = arena + ps->p[(*i)++].off;
    }
}

/* One arena of host expert bytes and what it holds. */
typedef struct {
    int cls;          /* the experts it holds: EXPERT_ON_HOST, or EXPERT_ON_BUS (with the EXPERT_ON_SPLIT ones) */
    int synthetic;    /* random bytes from seeds (a synthetic checkpoint), else copies of the bindings' bytes */
    size_t budget;    /* synthetic: bytes of its own at most; the experts beyond share them in a cycle */
    int pinned;       /* page-locked and mapped (the bus), else huge pages */
    int host_reads;   /* pinned, and the host's cores read it too (split experts): huge pages, page-locked once filled */
    uint64_t seed;    /* synthetic: the first expert weight's seed */
    int planes;       /* FP4 weights repacked into nibble planes (only the host's cores read this arena) */
    uint8_t *base;    /* out: the arena (NULL when the class is empty) */
    size_t bytes;     /* out */
    int n_own;        /* out: experts with bytes of their own */
} hx_arena;

/* The pinned arena holds the bus experts and the split ones: the GPU reads both over the bus. */
static int arena_holds(const hx_arena *a, int owner) {
    return owner == a->cls || (a->cls == EXPERT_ON_BUS && owner == EXPERT_ON_SPLIT);
}

/* Huge pages (util/bigmem.h), or cu_malloc_mapped's page-locked, mapped memory for the bus. An arena the host's cores
 * read too (split experts) takes huge pages, as the host's own arena does (on 4 KiB pages its loops would pay a TLB
 * miss every 4 KiB), and is registered with CUDA after the model's threads have filled it (arena_pin): so its pages
 * are spread over the memory nodes of the threads that first touch them, as the host arena's are. */
static uint8_t *arena_alloc(const hx_arena *a, size_t n) {
    return a->pinned && !a->host_reads ? cu_malloc_mapped(n) : bigmem_alloc(n);
}
static int arena_pin(hx_arena *a, size_t n, int64_t n_cls, dsv4_error *err) {
    if (!cu_host_register_mapped(a->base, n)) return DSV4_OK;
    bigmem_free(a->base, n);
    a->base = NULL;
    return dsv4_fail(err, DSV4_E_NOMEM, "cannot page-lock the %lld routed experts split by token (%.2f GiB, --bus-by-token): "
                     "a larger --gpu-mem, or --bus-share without --bus-by-token, needs less", (long long)n_cls, n / 1073741824.0);
}

/* Build arena a for every expert of class a->cls: its pieces, the memory, the fill by the model's threads, the
 * bindings moved into it; synthetic experts past the budget share the bytes of those with their own in a cycle. */
static int build_arena(cu_host_experts *hx, struct dsv4_model *m, hx_arena *a, dsv4_error *err) {
    const int L = hx->map.n_layers, E = hx->map.n_routed;
    int64_t n_cls = 0;
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) n_cls += arena_holds(a, expert_owner_of(&hx->map, l, e));
    a->base = NULL, a->bytes = 0, a->n_own = 0;
    if (!n_cls) return DSV4_OK;
    /* the experts with bytes of their own, in (layer, expert) order: own[i] = that expert's (layer, expert) */
    int (*own)[2] = malloc(sizeof *own * (size_t)n_cls);
    hx_pieces ps = { calloc((size_t)n_cls * 6, sizeof(hx_piece)), 0, 0 };
    int rc = DSV4_OK;
    if (!own || !ps.p) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory (host experts)");
    uint64_t seed = a->seed;
    for (int l = 0; !rc && l < L; l++)
        for (int e = 0; e < E; e++) {
            if (!arena_holds(a, expert_owner_of(&hx->map, l, e))) continue;
            if (a->synthetic && a->n_own && ps.bytes + (size_t)dsv4_expert_weight_bytes(&m->layers[l], e) > a->budget) continue;   /* shares, below */
            for (int k = 0; k < 3; k++) {
                const dsv4_weight *w = expert_weight(m, l, e, k);
                add_piece(&ps, a->synthetic ? NULL : w->data, (size_t)weight_bytes(w), w->fmt, 0, a->synthetic ? seed++ : 0,
                          a->planes && fp4_planes_fits(w) ? w->cols : 0);
                if (weight_scale_bytes(w)) add_piece(&ps, a->synthetic ? NULL : w->scale, weight_scale_bytes(w), w->fmt, 1, 0, 0);
            }
            own[a->n_own][0] = l, own[a->n_own][1] = e;
            a->n_own++;
        }
    if (!rc && !(a->base = arena_alloc(a, ps.bytes)))
        rc = a->pinned ? dsv4_fail(err, DSV4_E_NOMEM, "out of page-locked host memory for the %lld routed experts the GPU reads over "
                                   "the bus (%.2f GiB): --bus-share 0, or a smaller share without --bus-by-token, needs less", (long long)n_cls, ps.bytes / 1073741824.0)
                       : dsv4_fail(err, DSV4_E_NOMEM, "out of host memory for the %lld host experts (%.2f GiB)", (long long)n_cls,
                                   ps.bytes / 1073741824.0);
    if (!rc) {
        a->bytes = ps.bytes;
        hx_fill_job j = { &ps, a->base };
        dsv4_pool_run(m->pool, ps.n, fill_pieces, &j);
        if (a->host_reads && (rc = arena_pin(a, ps.bytes, n_cls, err))) a->bytes = 0;
    }
    for (int l = 0, i = 0, o = 0, n_shared = 0; !rc && l < L; l++)
        for (int e = 0; e < E; e++) {
            if (!arena_holds(a, expert_owner_of(&hx->map, l, e))) continue;
            if (o < a->n_own && own[o][0] == l && own[o][1] == e) {
                repoint_expert(a->base, m, l, e, &ps, &i);
                o++;
                continue;
            }
            /* share: every routed expert of a main layer has one shape */
            const int src = n_shared++ % a->n_own;
            for (int k = 0; k < 3; k++) {
                dsv4_weight *w = expert_weight(m, l, e, k);
                const dsv4_weight *from = expert_weight(m, own[src][0], own[src][1], k);
                w->fmt = from->fmt;   /* WF_FP4P where those bytes were repacked */
                w->data = from->data;
                w->scale = from->scale;
            }
            if (a->cls == EXPERT_ON_BUS) hx->bus_shared[(int64_t)l * E + e] = 1;
        }
    free(own);
    free(ps.p);
    return rc;
}

/* The bus experts: always a copy of their own, page-locked and mapped. */
static int place_bus(cu_host_experts *hx, struct dsv4_model *m, int synthetic, size_t budget, dsv4_error *err) {
    hx_arena a = { .cls = EXPERT_ON_BUS, .synthetic = synthetic, .budget = budget, .pinned = 1, .host_reads = hx->map.n_split > 0,
                   .seed = 0x805700000ULL };
    const int rc = build_arena(hx, m, &a, err);
    hx->bus_arena = a.base;
    hx->bus_bytes = a.bytes;
    hx->synth_distinct += a.n_own;
    return rc;
}

/* The host arena's FP4 experts in nibble planes (model/fp4_planes.h): where the host's linears take the pair order
 * on an AVX-512 set; by default (DSV4_CPU_FP4_PLANES=0 turns it off: fp4_planes.c has the measurements). The bus
 * arena keeps the checkpoint's layout: the GPU reads it. */
static int host_planes(const struct dsv4_model *m, dsv4_error *err) {
    return fp4_planes_wanted(m->dots == CPU_DOTS_PAIRS, dsv4_pool_kernels(m->pool)->name, 1, err);
}

int cuda_hx_place(cu_host_experts *hx, struct dsv4_model *m, dsv4_error *err) {
    const int planes = host_planes(m, err);   /* checked whatever the memory (a bad value fails every load) */
    if (planes < 0) return DSV4_E_ARG;
    uint64_t bytes = 0;   /* the experts the host computes */
    for (int l = 0; l < hx->map.n_layers; l++)
        for (int e = 0; e < hx->map.n_routed; e++)
            if (expert_owner_of(&hx->map, l, e) == EXPERT_ON_HOST) bytes += dsv4_expert_weight_bytes(&m->layers[l], e);
    int rc = st_memory_choose(bytes, &hx->memory, err);
    if (!rc && hx->memory == ST_MEM_POPULATE) {
        for (int l = 0; l < hx->map.n_layers; l++)
            for (int e = 0; e < hx->map.n_routed; e++)
                for (int k = 0; k < 3 && expert_owner_of(&hx->map, l, e) == EXPERT_ON_HOST; k++) {
                    const dsv4_weight *w = expert_weight(m, l, e, k);
                    st_populate(w->data, (size_t)weight_bytes(w));
                    st_populate(w->scale, weight_scale_bytes(w));
                }
    } else if (!rc && hx->memory == ST_MEM_COPY) {
        hx_arena a = { .cls = EXPERT_ON_HOST, .planes = planes };
        rc = build_arena(hx, m, &a, err);
        hx->arena = a.base;
        hx->arena_bytes = a.bytes;
    }
    return rc ? rc : place_bus(hx, m, 0, 0, err);
}

int cuda_hx_fill_synthetic(cu_host_experts *hx, struct dsv4_model *m, dsv4_error *err) {
    size_t budget;
    int rc = synth_host_budget(&budget, err);
    if (rc) return rc;
    hx->memory = ST_MEM_COPY;
    /* the budget split between the two arenas in proportion to what each class needs */
    double need_host = 0, need_bus = 0;
    for (int l = 0; l < hx->map.n_layers; l++)
        for (int e = 0; e < hx->map.n_routed; e++) {
            const int o = expert_owner_of(&hx->map, l, e);
            if (o == EXPERT_ON_HOST) need_host += (double)(size_t)dsv4_expert_weight_bytes(&m->layers[l], e);
            if (o == EXPERT_ON_BUS || o == EXPERT_ON_SPLIT) need_bus += (double)(size_t)dsv4_expert_weight_bytes(&m->layers[l], e);
        }
    const size_t budget_bus = need_bus > 0 ? (size_t)((double)budget * need_bus / (need_host + need_bus)) : 0;
    hx_arena a = { .cls = EXPERT_ON_HOST, .synthetic = 1, .budget = budget - budget_bus, .seed = 0x405700000ULL, .planes = host_planes(m, err) };
    rc = a.planes < 0 ? DSV4_E_ARG : build_arena(hx, m, &a, err);
    hx->arena = a.base;
    hx->arena_bytes = a.bytes;
    hx->synth_distinct = a.n_own;
    if (!rc) rc = place_bus(hx, m, 1, budget_bus, err);
    hx->synth_bytes = hx->arena_bytes + hx->bus_bytes;
    return rc;
}

int cuda_hx_reserve(cu_host_experts *hx, const dsv4_config *c, int T, dsv4_error *err) {
    if (T <= hx->T_cap) return DSV4_OK;
    free_buffers(hx);
    const size_t d = (size_t)c->dim, K = (size_t)c->n_act, t = (size_t)T;
    int ok = !moe_host_scratch_init(&hx->scr, c, T);
    /* mapped: a step enqueued ahead has the GPU write and read them itself (k_hx_publish, k_hx_await_rows) */
    ok = ok && (hx->xn_h = cu_malloc_mapped(sizeof(float) * t * d)) && (hx->route_w_h = cu_malloc_mapped(sizeof(float) * t * K)) &&
         (hx->rows_h = cu_malloc_mapped(sizeof(float) * t * K * d)) && (hx->route_e_h = cu_malloc_mapped(sizeof(int32_t) * t * K)) &&
         (hx->pair_h = cu_malloc_mapped(sizeof(int32_t) * t * K)) && (hx->rows_d = cu_malloc(sizeof(float) * t * K * d)) &&
         (hx->pair_d = cu_malloc(sizeof(int32_t) * t * K));
    if (!ok) {
        free_buffers(hx);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory for the host experts' buffers of a %d-token step (%.2f GiB page-locked, "
                         "as much on the GPU)", T, sizeof(float) * t * K * d / 1073741824.0);
    }
    hx->T_cap = T;
    return DSV4_OK;
}

int cuda_hx_fetch(cu_host_experts *hx, cu_stream st, const dsv4_config *c, const float *xn, const int32_t *route_e,
                  const float *route_w, int T) {
    const size_t d = (size_t)c->dim, K = (size_t)c->n_act, t = (size_t)T;
    if (cu_download_async(st, hx->xn_h, xn, sizeof(float) * t * d) || cu_download_async(st, hx->route_e_h, route_e, sizeof(int32_t) * t * K) ||
        cu_download_async(st, hx->route_w_h, route_w, sizeof(float) * t * K))
        return -1;
    return cu_event_record(hx->fetched, st);
}

/* Step 2 proper for main layer L, its inputs in xn_h / route_e_h / route_w_h: the host experts' pair rows into rows_h /
 * pair_h, with the time since t0 (waiting for the inputs) and the work counted (dsv4 bench). Returns the row count. */
static int host_rows(cu_host_experts *hx, struct dsv4_model *m, int L, int T, double t0) {
    const double t1 = now_ms();
    const uint8_t *owner = hx->map.owner + (int64_t)L * hx->map.n_routed;
    const uint64_t bytes0 = m->routed_bytes;   /* moe_host_rows adds each expert it computes */
    const int n = moe_host_rows(m, &m->layers[L], owner, hx->map.split_pct, hx->xn_h, hx->route_e_h, hx->route_w_h, T, &hx->scr,
                                hx->rows_h, hx->pair_h);
    hx->wait_ms += t1 - t0;
    hx->host_ms += now_ms() - t1;
    hx->host_rows += (uint64_t)n;
    hx->host_bytes += m->routed_bytes - bytes0;
    return n;
}

int cuda_hx_compute(cu_host_experts *hx, struct dsv4_model *m, int L, cu_stream st, int T, float *ey, dsv4_error *err) {
    const int d = m->cfg.dim;
    const double t0 = now_ms();
    if (cu_event_wait_host(hx->fetched)) return dsv4_fail(err, DSV4_E_STATE, "CUDA error waiting for layer %d's routing", L);
    const int n = host_rows(hx, m, L, T, t0);
    if (!n) return DSV4_OK;
    /* the copies read the page-locked buffers later: the next fetch (next layer) comes after them in the stream */
    if (cu_upload_async(st, hx->rows_d, hx->rows_h, sizeof(float) * (size_t)n * d) ||
        cu_upload_async(st, hx->pair_d, hx->pair_h, sizeof(int32_t) * (size_t)n))
        return dsv4_fail(err, DSV4_E_STATE, "CUDA error copying layer %d's host expert rows", L);
    cu_scatter_pair_rows(st, hx->rows_d, hx->pair_d, n, d, ey);
    return DSV4_OK;
}

/* ---- a step enqueued ahead (cuda_host_experts.h) ---- */

void cuda_hx_publish(cu_host_experts *hx, cu_stream st, const dsv4_config *c, const float *xn, const int32_t *route_e,
                     const float *route_w, int T, int L) {
    /* the server serves the listed layers in order: a layer published out of that order is the enqueue's error, told
     * by cuda_hx_serve_finish (the GPU's waits then time out rather than hang) */
    if (hx->n_published >= 0 && hx->n_published < hx->n_ahead && hx->ahead_layers[hx->n_published] == L) hx->n_published++;
    else hx->n_published = -1;
    cu_hx_publish(st, xn, route_e, route_w, T, c->dim, c->n_act, hx->xn_h, hx->route_e_h, hx->route_w_h, hx->blocks_done, hx->link,
                  L + 1);
}

void cuda_hx_await(cu_host_experts *hx, cu_stream st, const dsv4_config *c, int T, int L, float *ey) {
    cu_hx_await_rows(st, hx->link, L + 1, hx->rows_h, hx->pair_h, T * c->n_act, c->dim, ey, hx->blocks_done + 1);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* The server's wait until the GPU has published layer value - 1 (link->published >= value). It gives up when the
 * step's thread cancels, and, once the enqueue has ended, on a CUDA error or a stream that ran out without
 * publishing (asked every CU_HX_STREAM_POLL_US: a stream query is a driver call, and the flag it races with is
 * what the wait is for); and after CU_HX_TIMEOUT_S without news. */
static int wait_published(cu_host_experts *hx, int value, dsv4_error *err) {
    const double t0 = now_ms();
    double t_query = t0;
    for (unsigned spin = 1;; spin++) {
        if (__atomic_load_n(&hx->link->published, __ATOMIC_ACQUIRE) >= value) return DSV4_OK;
        cpu_relax();
        if (spin % 256) continue;
        if (__atomic_load_n(&hx->cancel, __ATOMIC_ACQUIRE)) return dsv4_fail(err, DSV4_E_STATE, "cuda: the step was given up");
        const double t = now_ms();
        if (__atomic_load_n(&hx->enqueued, __ATOMIC_ACQUIRE) && t - t_query >= CU_HX_STREAM_POLL_US * 1e-3) {
            t_query = t;
            const int q = cu_stream_poll(hx->serve_st);
            if (q < 0) return cu_finish(hx->serve_st, "a step with host experts", err);
            if (__atomic_load_n(&hx->link->published, __ATOMIC_ACQUIRE) >= value) return DSV4_OK;
            if (q > 0) return dsv4_fail(err, DSV4_E_STATE, "cuda: the step ended without handing layer %d's routing to the host", value - 1);
        }
        if (t - t0 > CU_HX_TIMEOUT_S * 1e3)
            return dsv4_fail(err, DSV4_E_STATE, "cuda: no routing of layer %d from the GPU in %d s", value - 1, CU_HX_TIMEOUT_S);
    }
}

/* Every layer the GPU waits on released, with no rows (a failed step: its results are not used). */
static void release_waiting(cu_host_experts *hx) {
    hx->link->n = 0;
    __atomic_store_n(&hx->link->ready, INT_MAX, __ATOMIC_RELEASE);
}

/* The server: every listed layer in order (the header's step 2); on a failure, every waiting layer released. */
static void *serve_layers(void *arg) {
    cu_host_experts *hx = arg;
    cu_hx_link *lk = hx->link;
    int rc = DSV4_OK;
    for (int i = 0; i < hx->n_ahead && !rc; i++) {
        const int L = hx->ahead_layers[i];
        const double t0 = now_ms();
        if ((rc = wait_published(hx, L + 1, &hx->served_err))) break;
        if (!i) hx->t_first = now_ms();
        if (i == hx->fail_at) {
            rc = dsv4_fail(&hx->served_err, DSV4_E_STATE, "cuda: the host's experts of layer %d failed (a test's injected failure)", L);
            break;
        }
        const int n = host_rows(hx, hx->serve_m, L, hx->serve_T, t0);
        /* the rows and their count before the flag: the GPU reads them once it sees it (x86 keeps stores in order;
         * the release keeps the compiler from moving them after) */
        lk->n = n;
        __atomic_store_n(&lk->ready, L + 1, __ATOMIC_RELEASE);
    }
    if (rc) release_waiting(hx);
    hx->served_rc = rc;
    return NULL;
}

int cuda_hx_serve_start(cu_host_experts *hx, struct dsv4_model *m, cu_stream st, int T, dsv4_error *err) {
    memset(hx->link, 0, sizeof *hx->link);   /* no kernel of this model reads it: the step before has finished */
    hx->n_published = 0;
    hx->serve_m = m;
    hx->serve_st = st;
    hx->serve_T = T;
    hx->served_rc = DSV4_OK;
    hx->enqueued = hx->cancel = 0;
    hx->t_begin = now_ms();
    hx->t_enqueued = hx->t_first = 0.0;
    /* the server's loops leave a core to this thread's enqueue (CU_HX_SPARE_MIN); the pool is the server's alone
     * until cuda_hx_serve_finish, which restores the width */
    hx->serve_width = dsv4_pool_width(m->pool);
    if (hx->serve_width >= CU_HX_SPARE_MIN) dsv4_pool_set_width(m->pool, hx->serve_width - 1);
    if (pthread_create(&hx->server, NULL, serve_layers, hx)) {
        dsv4_pool_set_width(m->pool, hx->serve_width);
        hx->fail_at = -1;
        return dsv4_fail(err, DSV4_E_NOMEM, "cuda: cannot start the thread that serves the host's experts");
    }
    hx->serving = 1;
    hx->ahead_steps++;
    return DSV4_OK;
}

int cuda_hx_serve_finish(cu_host_experts *hx, cu_stream st, int give_up, dsv4_error *err) {
    hx->t_enqueued = now_ms();
    if (give_up) __atomic_store_n(&hx->cancel, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&hx->enqueued, 1, __ATOMIC_RELEASE);
    if (hx->serving) {
        pthread_join(hx->server, NULL);
        dsv4_pool_set_width(hx->serve_m->pool, hx->serve_width);
    }
    hx->serving = 0;
    hx->fail_at = -1;
    int rc = give_up;
    if (!rc && hx->served_rc) {
        rc = hx->served_rc;
        if (err) *err = hx->served_err;
    }
    if (!rc && hx->n_published != hx->n_ahead)
        rc = dsv4_fail(err, DSV4_E_STATE, "cuda: the step handed off other layers than the host served (an error of the step's enqueue)");
    if (!rc) return DSV4_OK;
    /* release every layer still waiting and let the step run out before the link is used again */
    release_waiting(hx);
    cu_finish(st, "a failed step with host experts", NULL);
    return rc;
}

int cuda_hx_check(const cu_host_experts *hx, dsv4_error *err) {
    const int late = __atomic_load_n(&hx->link->late, __ATOMIC_ACQUIRE);
    if (!late) return DSV4_OK;
    return dsv4_fail(err, DSV4_E_STATE, "cuda: the GPU waited more than %d s for the host's expert rows of layer %d (the host had "
                     "answered up to layer %d; the step's launches took %.0f ms, its first routing reached the host after %.0f ms); "
                     "the step's results are void", CU_HX_TIMEOUT_S, late - 1, __atomic_load_n(&hx->link->ready, __ATOMIC_ACQUIRE) - 1,
                     hx->t_enqueued - hx->t_begin, hx->t_first > 0.0 ? hx->t_first - hx->t_begin : -1.0);
}
#else
typedef int dsv4_cuda_host_experts_unused; /* built only with CUDA=1 */
#endif
