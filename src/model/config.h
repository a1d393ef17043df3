/* Model hyper-parameters, read from a checkpoint's config.json (Hugging Face names) or
 * inference/config.json (official ModelArgs names). Spec §1. */
#ifndef DSV4_MODEL_CONFIG_H
#define DSV4_MODEL_CONFIG_H
#include "dsv4.h"
#include <stdint.h>

#define DSV4_MAX_LAYERS 128   /* backbone + speculative stages */

typedef struct dsv4_config {
    int vocab_size;
    int dim;                  /* hidden_size */
    int n_layers;             /* num_hidden_layers (backbone) */
    int n_mtp;                /* num_nextn_predict_layers: MTP / DSpark stages */
    int n_heads;
    int head_dim;             /* D: K = V width */
    int rope_dim;             /* R: last R dims of each head carry RoPE */
    int q_lora;
    int o_groups, o_lora;
    int window;               /* sliding_window */
    int compress_ratio[DSV4_MAX_LAYERS]; /* one per backbone layer, then one per MTP/DSpark stage */
    int n_routed, n_act, n_shared;
    int moe_inter;
    int n_hash;               /* layers [0, n_hash) route by token-id table */
    float route_scale, swiglu_limit, norm_eps;
    int hc_mult, hc_iters;
    float hc_eps;
    float rope_theta, compress_rope_theta;
    float rope_factor;
    int64_t original_seq_len; /* YaRN on the compressed regime iff > 0 */
    float beta_fast, beta_slow;
    int index_n_heads, index_head_dim, index_topk;
    int64_t max_position;
    int bos_id, eos_id;
    int expert_fp4;           /* 1: routed experts FP4 (I8-packed), 0: FP8 */
    /* DSpark (0731) */
    int dspark_block_size, dspark_noise_token, dspark_markov_rank;
    int dspark_target_layers[8], n_dspark_targets;
    int synthetic_holes;      /* "dsv4_synthetic": "holes" — a benchmark checkpoint whose big matrices are holes in
                                 sparse files (src/model/synthetic.h): the GPU fills them with random values */
    float synthetic_route_skew; /* "dsv4_route_skew": a generated checkpoint's router bias favours some experts
                                   (model/tiny.c gate_bias_values; dsv4 bench --route-skew); 0: none */
} dsv4_config;

/* Parse a config.json text (HF or official field names). `what` names the source for messages. */
int dsv4_config_parse(const char *json_text, const char *what, dsv4_config *cfg, dsv4_error *err);
/* Read <dir>/config.json, else <dir>/inference/config.json. */
int dsv4_config_load(const char *dir, dsv4_config *cfg, dsv4_error *err);
/* Check internal consistency (divisibility, ranges). */
int dsv4_config_validate(const dsv4_config *cfg, dsv4_error *err);

/* Derived quantities. */
static inline int cfg_nope_dim(const dsv4_config *c) { return c->head_dim - c->rope_dim; }
static inline int cfg_ratio(const dsv4_config *c, int layer) { return c->compress_ratio[layer]; }
#endif
