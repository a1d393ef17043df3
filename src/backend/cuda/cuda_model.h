/* The CUDA backend's copy of a model: every weight in its checkpoint format in GPU memory (dsv4_weight views
 * whose pointers are device addresses), the small fp32 vectors, and the step's scratch. Private to
 * src/backend/cuda/. */
#ifndef DSV4_CUDA_MODEL_H
#define DSV4_CUDA_MODEL_H
#include "backend/cuda/cu_kernels.h"
#include "model/model.h"

typedef struct {
    dsv4_weight fn;
    float *base, *scale;
} cu_hc;

typedef struct {
    dsv4_weight wkv, wgate;
    float *ape, *norm;
} cu_comp;

/* A layer's routed experts: device arrays [E] of the three projections (for cu_expert_linear). Under expert
 * parallelism an entry whose expert another GPU holds has data NULL (its tiles write -0.0f rows). */
typedef struct {
    dsv4_weight *w1, *w2, *w3;
    int fmt;                   /* the routed experts' format */
} cu_layer_experts;

typedef struct {
    int ratio, hash_routed;
    int ep;                    /* 1: the routed experts are spread over the GPUs (cuda_ep.h) */
    float *attn_norm, *ffn_norm;
    cu_hc hc_attn, hc_ffn;
    dsv4_weight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm, *attn_sink;
    cu_comp comp, icomp;
    dsv4_weight idx_wq_b, idx_weights_proj;
    dsv4_weight gate;
    float *gate_bias;          /* NULL on hash-routed layers */
    int32_t *tid2eid;          /* NULL on bias-routed layers */
    cu_layer_experts ex;
    dsv4_weight sw1, sw2, sw3;
} cu_layer;

/* Step scratch, sized for T_cap tokens (grown on demand, never shrunk). */
typedef struct {
    int T_cap, items_cap;
    int64_t idx_rows_cap;      /* indexer score scratch: T_cap x idx_rows_cap floats */
    int64_t att_keys_cap;      /* attention scratch: for queries of up to att_keys_cap keys ... */
    int64_t att_floats;        /* ... att_floats floats (cu_attention_scratch_floats) */
    float *X, *u, *xn, *x8, *sub, *mixraw, *mix, *qr, *q, *kv, *o, *z, *ck, *cz, *ick, *icz, *qi, *wi;
    uint8_t *kvs;
    int32_t *sel, *n_sel;
    float *router, *route_w;
    int32_t *route_e;
    cu_moe_plan plan;
    int max_tiles;
    float *eg, *ev, *ey, *seg, *sev, *ys, *feat;
    float *mtp_h, *mtp_out;    /* [T_cap][hc][dim]: the MTP head's stream inputs and h_proj outputs */
    float *head_x, *logits;    /* [CU_HEAD_ROWS][dim], [CU_HEAD_ROWS][vocab] */
    int32_t *head_rows;        /* [T_cap] */
    float *sample_w;           /* [CU_HEAD_ROWS][vocab]: cu_sample's scratch */
    cu_sample_req *sample_req; /* [items_cap] */
    int32_t *sample_tok;       /* [items_cap] */
    int32_t *dsp_ids;          /* DSpark draft: [CU_HEAD_ROWS + 1] anchor then the drafts */
    cu_sample_req *dsp_req;    /* [CU_HEAD_ROWS] */
    float *dsp_cat, *dsp_z;    /* [CU_HEAD_ROWS][dim + rank] = [y ; e], [CU_HEAD_ROWS] confidence logits */
    float *dsp_probs;          /* [CU_HEAD_ROWS][vocab] drafting distributions */
    float *idx_scores;
    int8_t *idx_qc;            /* OFFICIAL tensor-core indexer scores (cu_index_mma): the query codes [T][nI][cI] */
    float *idx_qu;             /* and their units [T][nI][cI/32] */
    unsigned *idx_offgrid;     /* pinned host word the indexer's kernels set on data off the FP4 grid (step_end) */
    unsigned *idx_split;       /* cu_index_split_words(idx_rows_cap): a decode step's selection over many blocks */
    /* OFFICIAL tensor-core linears (cuda_model.mma_on): act-quantized rows packed as E4M3 bytes + a scale per 128
     * columns (cu_mma.h). xq: the sub-layer's quantized input (x8; T rows of dim); yq: the other quantized inputs
     * (qr, z, seg; T rows of at most cu_mma_cols); egq: the experts' quantized hidden rows (T*K rows of inter). */
    uint8_t *xq, *yq, *egq;
    float *xqs, *yqs, *egqs;
    /* OFFICIAL BF16-input tensor-core linears (cu_mma.h, k_mma16.cu): the bf16-valued input of the linear at hand
     * packed as bf16 (xn for the compressors / weights_proj / router, o for wo_a, head_x for the head), rows of
     * cu_mma16_ld(width); [max(T * max(dim, heads * head_dim), CU_HEAD_ROWS * dim)]. */
    uint16_t *xb;
    float *att;                /* cu_attention's scratch */
    unsigned *att_bar;         /* [2] cu_attention's grid-barrier words (k_att_dec): zeroed when allocated */
    /* per-step metadata */
    int32_t *tok, *item_of;
    int64_t *pos;
    cu_item *items;
    cu_seq_layer *sl;          /* [n_layers][items_cap] */
    void **bufs;               /* every allocation above, for release */
    int n_bufs;
} cu_workspace;

#define CU_HEAD_ROWS 64

/* Stages of the step for cuda_profile. */
enum { ST_EMBED, ST_MHC, ST_QKV, ST_COMPRESS, ST_INDEX, ST_ATTEND, ST_OUTPUT, ST_ROUTE, ST_EXPERTS, ST_SHARED, ST_HEAD, ST_HOST,
       ST_COUNT };

typedef struct {
    int on;
    double t_last;             /* host clock at the last boundary */
    double ms[ST_COUNT];
    long steps;
} cu_profile;

/* The V4 MTP head's weights (block NULL when the checkpoint has none). */
typedef struct {
    cu_layer *block;
    dsv4_weight e_proj, h_proj;
    float *enorm, *hnorm, *norm;
    cu_hc hc_head;
} cu_mtp;

/* The DSpark drafter's weights (stages NULL when the checkpoint has none), its Markov and confidence heads included. */
typedef struct {
    int n_stages;
    cu_layer *stages;
    dsv4_weight markov_w1, markov_w2, confidence;
    dsv4_weight main_proj;
    float *main_norm, *norm;
    cu_hc hc_head;
} cu_dspark;

struct cu_ep;
struct cu_graphs;

struct cuda_model {
    int gpu;
    struct cu_ep *ep;          /* NULL on one GPU; else the other GPUs holding routed experts (cuda_ep.h) */
    int distinct;              /* main layers with weights of their own (all, except synthetic models bigger than
                                  the GPUs: cuda_model.c shared_source) */
    cu_stream st;
    dsv4_weight embed, head;
    float *norm;
    cu_hc hc_head;
    cu_layer *layers;
    cu_mtp mtp;
    cu_dspark dspark;
    float *rope_window, *rope_compress;
    void **allocs;             /* every weight allocation, released together */
    int n_allocs, cap_allocs;
    uint64_t weight_bytes;
    int key_limit;             /* cu_attention_key_limit(n_heads, head_dim) */
    cu_workspace ws;
    cu_profile prof;
    struct cu_host_experts *hx;/* NULL, or the routed experts kept in host memory (cuda_host_experts.h) */
    int mma_on;                /* OFFICIAL FP8/FP4 linears with act-quantized inputs on tensor cores (k_mma.cu):
                                  DSV4_CUDA_MMA at load (default 1), in OFFICIAL steps only */
    int pack_fp4;              /* FP4 routed experts packed for the tensor cores at load (OFFICIAL with mma_on only): 1
                                  (DSV4_CUDA_EXPERT_PACK) cu_layer_experts.fmt CU_FMT_FP4_FRAG, 2 (DSV4_CUDA_NATIVE_EXPERTS)
                                  CU_FMT_FP4_NAT (cu_mma.h) */
    int mma_stream;            /* those linears at <= 8 tokens through k_mma_stream.cu (the same bits): DSV4_CUDA_STREAM
                                  at load (default 1), passed to every cu_mma_* call */
    int idx_mma_on;            /* OFFICIAL indexer scores on int8 tensor cores (k_indexer.cu): DSV4_CUDA_IDX_MMA at load */
    int idx_tiles_on;          /* ... and a prefill step's in query tiles (k_index_score_tiles): DSV4_CUDA_IDX_TILES at load */
    int att_mma_on;            /* OFFICIAL attention scores and P.V on bf16 tensor cores (k_attention.cu):
                                  DSV4_CUDA_ATT_MMA at load (default 0), in OFFICIAL steps only */
    int att_dec_on;            /* the decode-sized attention scores kernel (k_attention.cu k_att_scores_dec): DSV4_CUDA_ATT_DEC at
                                  load (default 1); the same bits either way */
    int att_fused_on;          /* such a launch's whole attention in one kernel (k_attention.cu k_att_dec): DSV4_CUDA_ATT_FUSED at
                                  load (default 0); the same bits either way */
    int att_dec_mma_on;        /* the same on tensor cores (k_attention.cu k_att_dec_mma), where att_mma_on takes them:
                                  DSV4_CUDA_ATT_DEC_MMA at load (default 1); the same bits either way */
    int branch_on;             /* a layer's independent chains on a second stream (cuda_step.c branch_fork): DSV4_CUDA_BRANCH
                                  at load (default 1); the same bits either way */
    cu_stream side;            /* that stream (branch_on), and the events that fork it from st and join it back */
    void *fork_ev, *join_ev;   /* cu_event */
    int hx_ahead_on;           /* steps with host experts enqueued ahead (cuda_host_experts.h): DSV4_CUDA_HX_AHEAD at load */
    int graphs_on;             /* steps run as CUDA graphs (cuda_step.c): DSV4_CUDA_GRAPHS at load, cuda_graphs_set */
    struct cu_graphs *graphs;  /* the kept executable graphs and their counts (cu_graph.h); rank 0 only */
    unsigned long long *route_counts; /* device [n_layers][n_routed] while routes are counted (dsv4 profile) */
};

/* cuda_step.c */
void cuda_workspace_free(cu_workspace *ws);
#endif
