/* Expert parallelism: one model over n GPUs of this process (issue 16, DESIGN §8.4). Private to
 * src/backend/cuda/.
 *
 * Rank 0 is the model's own cuda_model: everything that is not a routed expert of a main layer, the routed
 * experts expert_place.h gives rank 0, the step's scratch and every sequence's state. Rank r >= 1 holds only the
 * routed experts of the main layers that expert_place.h gives it, and the scratch to run them. One MoE layer of a
 * step (cuda_step.c step_moe, when the layer is partitioned):
 *   1. rank 0 routes as on one GPU: router logits, top-k or hash selection, weights (route_e, route_w);
 *   2. broadcast from rank 0: the layer's normalised input rows xn [T][dim] and the routing [T][K];
 *   3. every rank builds the same plan from the same routing (k_moe_plan is a function of the routing alone) and
 *      runs, with the one-GPU kernels, the tiles of the experts it holds; a tile of an expert it does not hold
 *      writes its pair rows as -0.0f;
 *   4. reduce-sum of the pair rows ey [T*K][dim] onto rank 0: each row is one rank's and -0.0f everywhere else,
 *      and x + -0.0f == x, so rank 0 receives every row bit for bit whatever order NCCL adds in;
 *   5. rank 0 runs the shared expert and combines in increasing expert id, as on one GPU.
 * Every row is computed by the same kernel from the same inputs as on one GPU and lands in the same place, so
 * the step is bit-identical to the one-GPU step in both numeric modes, whoever computed what.
 *
 * Several hosts: the same five steps with one process per host (ncclCommInitRank over the network instead of
 * ncclCommInitAll), the processes of ranks >= 1 looping on "receive the step's shape, then per layer 2-4" —
 * rank 0's host thread drives every local GPU today because one process owns them all. */
#ifndef DSV4_CUDA_EP_H
#define DSV4_CUDA_EP_H
#include "backend/cuda/cu_comm.h"
#include "backend/cuda/cuda_model.h"

struct cuda_model;

/* The buffers one rank runs its routed experts with (rank 0: views into its step scratch). */
typedef struct {
    float *xn, *x8;            /* [T][dim] input rows, and their OFFICIAL fp8 quantisation */
    int32_t *route_e;          /* [T][K] */
    float *route_w;            /* [T][K] */
    cu_moe_plan plan;
    float *eg, *ev, *ey;       /* [T*K][inter], [T*K][inter], [T*K][dim] */
    int mma;                   /* OFFICIAL on tensor cores (k_mma.cu): the packed rows below are used */
    uint8_t *xq, *egq;         /* x8 packed [T][cu_mma_ld(dim)], eg packed [T*K][cu_mma_ld(inter)] */
    float *xqs, *egqs;         /* their scales [T][dim/128], [T*K][inter/128] (rounded up) */
    int xq_ready;              /* xq / xqs already hold xn packed (rank 0: the step's hc_pre packed it) */
    int stream;                /* the tensor-core kernels' streaming path for few tokens (cuda_model.mma_stream) */
    int plan_ready;            /* plan already built from route_e / route_w (rank 0: cu_route_plan did it) */
} cu_moe_bufs;

/* One rank >= 1: its GPU, stream, experts (layers[L].w1/w2/w3: device arrays [E] whose entries it does not hold
 * have data NULL) and scratch. */
typedef struct {
    struct cuda_model *cm;     /* weights and stream of this rank (only the routed experts are set) */
    int T_cap;
    cu_moe_bufs b;
    void **bufs;
    int n_bufs, cap_bufs;
} cu_ep_rank;

typedef struct cu_ep {
    int n;                     /* ranks, GPUs gpu0 .. gpu0 + n - 1 */
    cu_comm *comm;
    cu_ep_rank *rank;          /* [n]; rank[0] is unused (rank 0 is the model's cuda_model) */
    uint64_t *weight_bytes;    /* [n] bytes of weights each rank holds */
} cu_ep;

/* The routed experts of one MoE layer for T tokens on one GPU (k_moe.cu, k_linear.cu, k_mma.cu): plan, OFFICIAL
 * input quantisation, w1 / w3, SwiGLU, w2, OFFICIAL rounding, into b->ey. The one-GPU path and every EP rank.
 * OFFICIAL: when cu_moe_input_packed, the input rows end up packed in b->xq / b->xqs (tensor cores) and b->x8 is
 * not written; otherwise b->x8 holds their act_quant copy. 0, or an error with one line in err (the tensor-core
 * kernels refusing what cu_mma_takes_experts accepted: a bug). */
int cu_moe_routed(cu_stream st, const dsv4_config *c, int official, const cu_layer_experts *ex, int T, int max_tiles,
                  const cu_moe_bufs *b, dsv4_error *err);
int cu_moe_input_packed(const cu_moe_bufs *b, const cu_layer_experts *ex, int official, int dim);

/* Scratch for steps of T tokens on every rank >= 1 (called before a step changes anything). */
int  cuda_ep_reserve(cu_ep *ep, const dsv4_config *c, int T, dsv4_error *err);
/* Steps 2-4 above for main layer L: b0 is rank 0's buffers, routing already in b0->route_e / route_w. Enqueued
 * on every rank's stream; rank 0's b0->ey holds every pair row when its stream reaches this point. */
int  cuda_ep_routed(cu_ep *ep, const struct cuda_model *cm0, const dsv4_config *c, int official, int L, int T, int max_tiles,
                    const cu_moe_bufs *b0, dsv4_error *err);
/* Release every rank's scratch (the ranks' weights are released with the model, cuda_model.c). */
void cuda_ep_free_scratch(cu_ep *ep);
#endif
