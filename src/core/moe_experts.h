/* Running a layer's SwiGLU experts on the CPU (spec §11.2): one at a time (three linears, three pool
 * dispatches each), or grouped: all gate/up projections and activations of a group of experts in one pool
 * dispatch, then all their down projections in a second (issue 17: at decode one expert's matrix is a few MB,
 * and 21 dispatches a layer left the threads waiting on each other more than reading weights).
 *
 * Both give the same bits for every output element: each row of each projection is computed by the pool's
 * linear_rows over that expert's n tokens exactly as cpu_linear computes it (the fused one-token dot when
 * n == 1, the tile kernel otherwise, dot_f32's reduction order either way; in the pair order, its rows as
 * cpu_linear_pairs computes them; on AMX, cpu_amx_rows as cpu_linear_amx computes it), and the roundings
 * between them
 * (bf16, clamped SwiGLU, the OFFICIAL FP8 quantization per 128 columns) are element-wise or per 128-column
 * block, so cutting the work into row blocks and spreading them over threads changes no value. */
#ifndef DSV4_CORE_MOE_EXPERTS_H
#define DSV4_CORE_MOE_EXPERTS_H
#include "model/model.h"

/* One expert over the n tokens routed to it in a step. */
typedef struct {
    const dsv4_weight *w1, *w2, *w3;  /* gate [I][d], down [d][I], up [I][d] */
    int n;
    const float *x;        /* [n][d] inputs; OFFICIAL: already FP8-quantized per 128 columns (x is only read) */
    const float *weight;   /* [n] routing weights multiplying the activation before w2; NULL: the shared expert */
    float *g, *v;          /* [n][I] scratch: gate (then the activation), up */
    float *y;              /* [n][d] outputs (bf16-rounded in OFFICIAL mode) */
} moe_expert_call;

/* The most calls one grouped run takes (bounds its bookkeeping; callers start a new group beyond it). */
enum { MOE_GROUP_CALLS = 64 };

/* Every call, two pool dispatches in all. n_calls <= MOE_GROUP_CALLS + 1 (the shared expert may ride along).
 * A model in the pair order or on AMX (m->dots) runs its rows as cpu_linear_pairs or cpu_linear_amx would
 * (backend/cpu/pairs.h's and amx.h's pieces). */
void moe_experts_grouped(struct dsv4_model *m, const moe_expert_call *calls, int n_calls);
/* One call as three linears (linear_bf16_in, in the model's order m->dots), three pool dispatches. */
void moe_expert_one(struct dsv4_model *m, const moe_expert_call *call);
/* silu(x) = x / (1 + expf(-x)) for every bf16 x, indexed by its 16 bits (NaNs included): an OFFICIAL model's
 * m->silu_bf16 (malloc'd, 256 KiB; NULL when out of memory). */
float *moe_silu_bf16_table(void);
#endif
