/* The loaded model: config, the memory-mapped checkpoint, and every tensor bound to its role.
 * Large matrices stay in their stored format (dsv4_weight views into the mapping); small vectors (norm
 * weights, biases, sinks, ape, hc parameters) are decoded once into owned fp32 arrays. */
#ifndef DSV4_MODEL_MODEL_H
#define DSV4_MODEL_MODEL_H
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "core/profile.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weight.h"

/* One mHC site (attention or FFN of a block, or the head collapse). */
typedef struct {
    dsv4_weight fn;      /* [mix][hc*d] fp32 */
    float *base;         /* [mix] */
    float *scale;        /* [3] (site) or [1] (head) */
} dsv4_hc_weights;

/* One compressor (main: width D; indexer: width index_head_dim). */
typedef struct {
    int ratio;           /* m: 4 or 128 */
    int overlap;         /* 1 iff m == 4: chunk k also pools the A half of chunk k-1 */
    int width;           /* c: output row width */
    dsv4_weight wkv;     /* [coff*c][d] */
    dsv4_weight wgate;   /* [coff*c][d] */
    float *ape;          /* [m][coff*c] */
    float *norm;         /* [c] */
} dsv4_compressor_weights;

typedef struct {
    int ratio;           /* 0 (window only), 4 (CSA), 128 (HCA) */
    int hash_routed;     /* 1: experts chosen by tid2eid */
    float *attn_norm, *ffn_norm;
    dsv4_hc_weights hc_attn, hc_ffn;
    /* attention */
    dsv4_weight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm, *attn_sink;
    dsv4_compressor_weights comp;          /* ratio != 0 */
    dsv4_compressor_weights icomp;         /* ratio == 4: the indexer's compressor */
    dsv4_weight idx_wq_b, idx_weights_proj;/* ratio == 4 */
    /* MoE */
    dsv4_weight gate;                      /* [E][d] */
    float *gate_bias;                      /* [E] (bias-routed layers) */
    int32_t *tid2eid;                      /* [V][n_act] (hash-routed layers) */
    dsv4_weight *w1, *w2, *w3;             /* [E] routed experts */
    dsv4_weight sw1, sw2, sw3;             /* shared expert */
    uint64_t *route_counts;                /* [E] main layers while routes are counted (dsv4 profile), else NULL:
                                            * each step adds 1 per token for each distinct expert it routes to */
} dsv4_layer;

/* The V4 MTP head (spec §13): one window-only block with its own MoE and mHC, the projections that mix the
 * next token's embedding into the target's final HC state, and its own head collapse. Embedding and LM head are
 * the backbone's. */
typedef struct {
    dsv4_layer block;
    dsv4_weight e_proj, h_proj;   /* [d][d] FP8 */
    float *enorm, *hnorm, *norm;  /* [d] */
    dsv4_hc_weights hc_head;
} dsv4_mtp_head;

/* The V4-Flash-0731 DSpark drafter (spec §14): window-only stages whose attention reads keys projected from
 * the target's captured layer features (context) plus the draft block's own keys, a Markov head correcting
 * each draft logit row by the previous draft token, and a confidence head. */
typedef struct {
    int n_stages;
    dsv4_layer *stage;            /* [n_stages] blocks (mtp.s.) */
    dsv4_weight main_proj;        /* [d][n_targets*d] FP8 */
    float *main_norm;             /* [d] */
    float *norm;                  /* last stage's final norm [d] */
    dsv4_hc_weights hc_head;      /* last stage's */
    dsv4_weight markov_w1;        /* [V][rank] embedding of the previous token */
    dsv4_weight markov_w2;        /* [V][rank] logit projection */
    dsv4_weight confidence;       /* [1][d + rank] */
} dsv4_dspark_head;

/* RoPE frequencies of one regime (spec §4.1): f[i] for pair i < rope_dim/2. */
typedef struct {
    float *freq;
} dsv4_rope;

struct dsv4_model {
    dsv4_config cfg;
    dsv4_mode mode;
    st_memory weight_memory; /* where the checkpoint's bytes live (model/safetensors.h): CPU models copy them to huge
                              * pages when they fit */
    synth_host synth;        /* a synthetic checkpoint on the CPU: the arena its tensors point into (model/synthetic.h) */
    cpu_profile prof;        /* per-stage time of CPU steps, when on (core/profile.h; dsv4 bench --profile) */
    cpu_dots dots;           /* the order of the CPU's linears with bf16-exact inputs (backend/cpu/kernels.h): OFFICIAL:
                              * the pair order (pairs.h; on a CUDA model, its host-resident experts), or AMX's
                              * (dsv4_load_opts.cpu_amx, CPU device), or fp32 with DSV4_CPU_PAIRS=0; EXACT: fp32 */
    float *silu_bf16;        /* OFFICIAL: silu of every bf16 value, by its bits (core/moe_experts.h); owned */
    int moe_per_expert;      /* run the MoE experts one at a time, three pool dispatches each, instead of grouped
                              * (core/moe_experts.h): the reference the grouped run is tested against */
    uint64_t routed_bytes;   /* weight bytes of the routed experts CPU steps have run, each once a step
                              * (benchmarks read the difference: the distinct experts a step touches) */
    int max_spec;            /* ring slack for speculative rollback */
    int ring_len;            /* window + max_spec */
    int kv_format;           /* dsv4_kv_format of every sequence's KV rows (state/kvrows.h) */
    st_archive ckpt;
    dsv4_pool *pool;
    dsv4_weight embed, head;
    float *norm;
    dsv4_hc_weights hc_head;
    dsv4_layer *layers;      /* [n_layers] */
    dsv4_mtp_kind spec_heads;/* the speculative head the checkpoint carries (and the config describes) */
    dsv4_mtp_head *mtp;      /* V4 MTP head, when spec_heads == MTP_V4 */
    dsv4_dspark_head *dspark;/* DSpark drafter, when spec_heads == MTP_DSPARK */
    dsv4_rope rope_window;   /* ratio 0: rope_theta, no YaRN */
    dsv4_rope rope_compress; /* ratio != 0: compress_rope_theta + YaRN */
    uint64_t fingerprint;    /* hash of config + tensor table, for state files */
    int progress;            /* print loading / long-prefill progress on stderr (a terminal, not quiet) */
    float **owned;           /* every fp32 vector decoded at load, freed with the model */
    int n_owned;
    struct dsv4_workspace *ws; /* scratch for dsv4_step, grown on demand (one step at a time per model) */
    int device;              /* a dsv4_device: where dsv4_step runs and where new sequences keep their state */
    const struct seq_mem *state_mem; /* the memory of that device (state/statemem.h) */
    struct cuda_model *cuda; /* the CUDA backend's copy of the weights and its step scratch (device cuda) */
    uint64_t *route_counts;  /* [n_layers][n_routed] while routes are counted (model_count_routes), else NULL */
    uint64_t counted_tokens; /* tokens the counted steps ran */
};

/* Where new sequences of m keep their state. */
static inline const struct seq_mem *model_state_mem(const struct dsv4_model *m) { return m->state_mem; }

/* Compute the RoPE frequencies for a regime. yarn: apply YaRN with cfg's factor/beta/original_seq_len. */
int dsv4_rope_init(dsv4_rope *r, const dsv4_config *cfg, float base, int yarn, dsv4_error *err);
static inline const dsv4_rope *layer_rope(const struct dsv4_model *m, int ratio) {
    return ratio ? &m->rope_compress : &m->rope_window;
}
#endif
