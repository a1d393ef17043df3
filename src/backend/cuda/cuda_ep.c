/* Expert parallelism over the GPUs of this process: the per-layer exchange of cuda_ep.h, and the routed-expert
 * launch sequence shared with the one-GPU step. */
#ifdef DSV4_CUDA
#include "backend/cuda/cuda_ep.h"
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_runtime.h"
#include "backend/cuda/cuda_model.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

int cu_moe_input_packed(const cu_moe_bufs *b, const cu_layer_experts *ex, int official, int dim) {
    return official && b->mma && cu_mma_takes_experts(ex->fmt, dim);
}

/* One expert projection, rows x cols: on tensor cores from the packed rows xq / xqs when `packed` (the caller
 * decided by cu_mma_takes_experts; out_bf16 rounds in the epilogue), else on CUDA cores (k_linear.cu) from x. */
static int expert_proj(cu_stream st, const cu_layer_experts *ex, const dsv4_weight *w, int rows, int cols, const cu_moe_bufs *b,
                       const cu_moe_plan *plan, int max_tiles, int packed, const float *x, const uint8_t *xq, const float *xqs,
                       int x_by_pair, float *y, int out_bf16, int one_token, dsv4_error *err) {
    if (packed)
        return cu_mma_expert_linear(st, w, rows, cols, ex->fmt, plan, max_tiles, xq, cu_mma_ld(cols), xqs, cu_mma_lds(cols),
                                    x_by_pair, y, rows, out_bf16, b->stream, err);
    cu_expert_linear(st, w, rows, cols, ex->fmt, plan, max_tiles, x, cols, x_by_pair, y, rows, one_token);
    return 0;
}

int cu_moe_routed(cu_stream st, const dsv4_config *c, int official, const cu_layer_experts *ex, int T, int max_tiles,
                  const cu_moe_bufs *b, dsv4_error *err) {
    const int d = c->dim, K = c->n_act, I = c->moe_inter, P = T * K;
    cu_moe_plan plan = b->plan;   /* the struct holds device pointers: building writes through them */
    if (!b->plan_ready) cu_moe_plan_build(st, b->route_e, b->route_w, T, K, c->n_routed, &plan);
    /* FP8/FP4 experts see their input rows quantized per 128 columns (OFFICIAL): packing quantizes (cu_mma.h), the
     * CUDA-core path reads the fp32 act_quant copy */
    const int in_packed = cu_moe_input_packed(b, ex, official, d), mid_packed = official && b->mma && cu_mma_takes_experts(ex->fmt, I);
    const float *xe = b->xn;
    if (in_packed) {
        if (!b->xq_ready) cu_mma_pack_act(st, b->xn, d, T, d, b->xq, cu_mma_ld(d), b->xqs, cu_mma_lds(d), NULL);
    } else if (official) {
        cu_act_quant(st, b->xn, d, b->x8, d, T, d, 128, 0);
        xe = b->x8;
    }
    int rc;
    if (in_packed) {   /* w1 and w3 over the same packed rows: one launch */
        rc = cu_mma_expert_linear_pair(st, ex->w1, ex->w3, I, d, ex->fmt, &plan, max_tiles, b->xq, cu_mma_ld(d), b->xqs, cu_mma_lds(d), 0,
                                       b->eg, b->ev, I, official, b->stream, err);
    } else {
        rc = expert_proj(st, ex, ex->w1, I, d, b, &plan, max_tiles, in_packed, xe, b->xq, b->xqs, 0, b->eg, official, T == 1, err);
        if (!rc) rc = expert_proj(st, ex, ex->w3, I, d, b, &plan, max_tiles, in_packed, xe, b->xq, b->xqs, 0, b->ev, official, T == 1, err);
    }
    if (mid_packed) {   /* SwiGLU and the packing in one launch (the packing quantizes) */
        cu_swiglu_pack(st, official, b->eg, b->ev, b->plan.pair_weight, P, I, c->swiglu_limit, b->egq, cu_mma_ld(I), b->egqs,
                       cu_mma_lds(I));
    } else {
        cu_swiglu(st, official, b->eg, b->ev, b->plan.pair_weight, P, I, c->swiglu_limit);
        if (official) cu_act_quant(st, b->eg, I, b->eg, I, P, I, 128, 0);
    }
    if (!rc) rc = expert_proj(st, ex, ex->w2, d, I, b, &plan, max_tiles, mid_packed, b->eg, b->egq, b->egqs, 1, b->ey, official, T == 1, err);
    if (official && !mid_packed) cu_round_bf16(st, b->ey, (int64_t)P * d);
    return rc;
}

/* ---- scratch of ranks >= 1 ---------------------------------------------------------------------------------------- */

static void scratch_free(cu_ep_rank *rk) {
    for (int i = 0; i < rk->n_bufs; i++) cu_free(rk->bufs[i]);
    free(rk->bufs);
    rk->bufs = NULL;
    rk->n_bufs = rk->cap_bufs = 0;
    rk->T_cap = 0;
    memset(&rk->b, 0, sizeof rk->b);
}

static void *take(cu_ep_rank *rk, size_t n, int *failed) {
    if (*failed) return NULL;
    void *p = cu_malloc(n);
    if (p && rk->n_bufs == rk->cap_bufs) {
        const int nc = rk->cap_bufs ? 2 * rk->cap_bufs : 16;
        void **nb = realloc(rk->bufs, sizeof(void *) * (size_t)nc);
        if (!nb) { cu_free(p); p = NULL; }
        else { rk->bufs = nb; rk->cap_bufs = nc; }
    }
    if (!p) { *failed = 1; return NULL; }
    rk->bufs[rk->n_bufs++] = p;
    return p;
}

static int scratch_ensure(cu_ep_rank *rk, const dsv4_config *c, int T, int *failed) {
    if (T <= rk->T_cap) return 0;
    if (T < 16) T = 16;
    scratch_free(rk);
    const size_t d = (size_t)c->dim, P = (size_t)T * (size_t)c->n_act, I = (size_t)c->moe_inter;
    const size_t tiles = (size_t)cu_moe_tiles_max((int64_t)P, c->n_routed, CU_MOE_TILE);
    cu_moe_bufs *b = &rk->b;
    b->xn = take(rk, sizeof(float) * (size_t)T * d, failed);
    b->x8 = take(rk, sizeof(float) * (size_t)T * d, failed);
    b->route_e = take(rk, sizeof(int32_t) * P, failed);
    b->route_w = take(rk, sizeof(float) * P, failed);
    b->plan.pair_token = take(rk, sizeof(int32_t) * P, failed);
    b->plan.pair_weight = take(rk, sizeof(float) * P, failed);
    b->plan.tile_expert = take(rk, sizeof(int32_t) * tiles, failed);
    b->plan.tile_first = take(rk, sizeof(int32_t) * tiles, failed);
    b->plan.tile_count = take(rk, sizeof(int32_t) * tiles, failed);
    b->plan.n_tiles = take(rk, sizeof(int32_t), failed);
    b->plan.token_pairs = take(rk, sizeof(int32_t) * P, failed);
    b->eg = take(rk, sizeof(float) * P * I, failed);
    b->ev = take(rk, sizeof(float) * P * I, failed);
    b->ey = take(rk, sizeof(float) * P * d, failed);
    b->xq = take(rk, (size_t)T * (size_t)cu_mma_ld(c->dim), failed);
    b->xqs = take(rk, sizeof(float) * (size_t)T * (size_t)cu_mma_lds(c->dim), failed);
    b->egq = take(rk, P * (size_t)cu_mma_ld(c->moe_inter), failed);
    b->egqs = take(rk, sizeof(float) * P * (size_t)cu_mma_lds(c->moe_inter), failed);
    if (*failed) {
        scratch_free(rk);
        return -1;
    }
    rk->T_cap = T;
    return 0;
}

int cuda_ep_reserve(cu_ep *ep, const dsv4_config *c, int T, dsv4_error *err) {
    int rc = 0;
    for (int r = 1; r < ep->n && !rc; r++) {
        cu_use(ep->rank[r].cm->gpu);
        int failed = 0;
        if (scratch_ensure(&ep->rank[r], c, T, &failed)) {
            size_t fb = 0, tb = 0;
            cu_mem_info(&fb, &tb);
            rc = dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory on GPU %d (expert rank %d): a step of %d tokens needs its expert "
                           "scratch, %.2f GiB are free", ep->rank[r].cm->gpu, r, T, fb / 1073741824.0);
        }
    }
    return rc;
}

int cuda_ep_routed(cu_ep *ep, const struct cuda_model *cm0, const dsv4_config *c, int official, int L, int T, int max_tiles,
                   const cu_moe_bufs *b0, dsv4_error *err) {
    enum { MAXR = 16 };
    const int n = ep->n, K = c->n_act;
    const size_t P = (size_t)T * (size_t)K, d = (size_t)c->dim;
    void *xn[MAXR], *re[MAXR], *rw[MAXR];
    float *ey[MAXR];
    cu_stream st[MAXR];
    for (int r = 0; r < n; r++) {
        const cu_moe_bufs *b = r ? &ep->rank[r].b : b0;
        xn[r] = b->xn;
        re[r] = b->route_e;
        rw[r] = b->route_w;
        ey[r] = b->ey;
        st[r] = r ? ep->rank[r].cm->st : cm0->st;
    }
    int rc = cu_comm_begin(ep->comm, err);
    if (!rc) rc = cu_comm_broadcast(ep->comm, xn, sizeof(float) * (size_t)T * d, st, err);
    if (!rc) rc = cu_comm_broadcast(ep->comm, re, sizeof(int32_t) * P, st, err);
    if (!rc) rc = cu_comm_broadcast(ep->comm, rw, sizeof(float) * P, st, err);
    const int rc_end = cu_comm_end(ep->comm, rc ? NULL : err);
    if (rc || rc_end) return rc ? rc : rc_end;
    /* the other ranks first, so that their kernels are queued while rank 0's run */
    for (int r = 1; r < n; r++) {
        cu_use(ep->rank[r].cm->gpu);
        ep->rank[r].b.mma = b0->mma;   /* every rank computes the same numerics as rank 0 */
        ep->rank[r].b.stream = b0->stream;
        ep->rank[r].b.xq_ready = 0;    /* it packs its own copy of the rows */
        ep->rank[r].b.plan_ready = 0;  /* and plans from its copy of the routing */
        if (cu_moe_routed(st[r], c, official, &ep->rank[r].cm->layers[L].ex, T, max_tiles, &ep->rank[r].b, err)) return DSV4_E_STATE;
    }
    cu_use(cm0->gpu);
    if (cu_moe_routed(st[0], c, official, &cm0->layers[L].ex, T, max_tiles, b0, err)) return DSV4_E_STATE;
    return cu_comm_reduce_sum(ep->comm, ey, P * d, st, err);
}

void cuda_ep_free_scratch(cu_ep *ep) {
    for (int r = 1; r < ep->n; r++) {
        if (!ep->rank[r].cm) continue;
        cu_use(ep->rank[r].cm->gpu);
        scratch_free(&ep->rank[r]);
    }
}
#else
typedef int dsv4_cuda_ep_unused; /* built only with CUDA=1 */
#endif
