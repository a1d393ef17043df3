#include "model/config.h"
#include "util/error.h"
#include "util/fileio.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Look a field up under its HF name, then its official name. */
static json_t *field(json_t *root, const char *hf, const char *off) {
    json_t *v = hf ? json_object_get(root, hf) : NULL;
    if (!v && off) v = json_object_get(root, off);
    if (v && json_is_null(v)) v = NULL;
    return v;
}

static int get_int(json_t *root, const char *hf, const char *off, int64_t def, int required, int64_t *out,
                   const char *what, dsv4_error *err) {
    json_t *v = field(root, hf, off);
    if (!v) {
        if (required) return dsv4_fail(err, DSV4_E_FORMAT, "%s: missing field \"%s\"", what, hf ? hf : off);
        *out = def;
        return 0;
    }
    if (json_is_integer(v)) { *out = json_integer_value(v); return 0; }
    /* A whole-valued real (4.0) counts as an integer. The range check comes first: converting a double outside
     * int64_t's range is undefined behaviour (UBSan, tests/fuzz/fuzz_config.c: "num_experts_per_tok": 1e301). */
    const double d = json_is_real(v) ? json_real_value(v) : 0.5;
    if (d >= -9.0e18 && d <= 9.0e18 && d == (double)(int64_t)d) {
        *out = (int64_t)d;
        return 0;
    }
    return dsv4_fail(err, DSV4_E_FORMAT, "%s: field \"%s\" must be an integer", what, hf ? hf : off);
}

static int get_num(json_t *root, const char *hf, const char *off, double def, int required, double *out,
                   const char *what, dsv4_error *err) {
    json_t *v = field(root, hf, off);
    if (!v) {
        if (required) return dsv4_fail(err, DSV4_E_FORMAT, "%s: missing field \"%s\"", what, hf ? hf : off);
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: field \"%s\" must be a number", what, hf ? hf : off);
    *out = json_number_value(v);
    return 0;
}

#define INT_FIELD(dst, hf, off, def, req)                                                     \
    do {                                                                                      \
        int64_t v_;                                                                           \
        if ((rc = get_int(root, hf, off, def, req, &v_, what, err))) goto done;               \
        if (v_ < -2147483647LL || v_ > 2147483647LL) {                                        \
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: field \"%s\" out of range", what, hf);    \
            goto done;                                                                        \
        }                                                                                     \
        (dst) = (int)v_;                                                                      \
    } while (0)
#define NUM_FIELD(dst, hf, off, def, req)                                                     \
    do {                                                                                      \
        double v_;                                                                            \
        if ((rc = get_num(root, hf, off, def, req, &v_, what, err))) goto done;               \
        (dst) = (float)v_;                                                                    \
    } while (0)

int dsv4_config_parse(const char *text, const char *what, dsv4_config *cfg, dsv4_error *err) {
    json_error_t jerr;
    /* `root` is where the field macros look, and the rope_scaling block points it at a sub-object for a while;
     * `doc` is what gets freed. (Freeing `root` leaked the document and freed the borrowed sub-object when a
     * rope_scaling field had the wrong type: found by tests/fuzz/fuzz_config.c.) */
    json_t *const doc = json_loads(text, 0, &jerr);
    json_t *root = doc;
    if (!root)
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: malformed JSON at line %d: %s", what, jerr.line, jerr.text);
    int rc = 0;
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(root)) { rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: not a JSON object", what); goto done; }

    INT_FIELD(cfg->vocab_size, "vocab_size", NULL, 0, 1);
    INT_FIELD(cfg->dim, "hidden_size", "dim", 0, 1);
    INT_FIELD(cfg->n_layers, "num_hidden_layers", "n_layers", 0, 1);
    INT_FIELD(cfg->n_mtp, "num_nextn_predict_layers", "n_mtp_layers", 0, 0);
    INT_FIELD(cfg->n_heads, "num_attention_heads", "n_heads", 0, 1);
    INT_FIELD(cfg->head_dim, "head_dim", NULL, 512, 0);
    INT_FIELD(cfg->rope_dim, "qk_rope_head_dim", "rope_head_dim", 64, 0);
    INT_FIELD(cfg->q_lora, "q_lora_rank", NULL, 0, 1);
    INT_FIELD(cfg->o_groups, "o_groups", NULL, 1, 0);
    INT_FIELD(cfg->o_lora, "o_lora_rank", NULL, 0, 1);
    INT_FIELD(cfg->window, "sliding_window", "window_size", 128, 0);
    INT_FIELD(cfg->n_routed, "n_routed_experts", NULL, 0, 1);
    INT_FIELD(cfg->n_act, "num_experts_per_tok", "n_activated_experts", 0, 1);
    INT_FIELD(cfg->n_shared, "n_shared_experts", NULL, 1, 0);
    INT_FIELD(cfg->moe_inter, "moe_intermediate_size", "moe_inter_dim", 0, 1);
    INT_FIELD(cfg->n_hash, "num_hash_layers", "n_hash_layers", 0, 0);
    NUM_FIELD(cfg->route_scale, "routed_scaling_factor", "route_scale", 1.0, 0);
    NUM_FIELD(cfg->swiglu_limit, "swiglu_limit", NULL, 0.0, 0);
    NUM_FIELD(cfg->norm_eps, "rms_norm_eps", "norm_eps", 1e-6, 0);
    INT_FIELD(cfg->hc_mult, "hc_mult", NULL, 4, 0);
    INT_FIELD(cfg->hc_iters, "hc_sinkhorn_iters", NULL, 20, 0);
    NUM_FIELD(cfg->hc_eps, "hc_eps", NULL, 1e-6, 0);
    NUM_FIELD(cfg->rope_theta, "rope_theta", NULL, 10000.0, 0);
    NUM_FIELD(cfg->compress_rope_theta, "compress_rope_theta", NULL, 160000.0, 0);
    INT_FIELD(cfg->index_n_heads, "index_n_heads", NULL, 64, 0);
    INT_FIELD(cfg->index_head_dim, "index_head_dim", NULL, 128, 0);
    INT_FIELD(cfg->index_topk, "index_topk", NULL, 512, 0);
    {
        int64_t v;
        if ((rc = get_int(root, "max_position_embeddings", "max_seq_len", 1048576, 0, &v, what, err))) goto done;
        cfg->max_position = v;
    }
    {
        json_t *syn = json_object_get(root, "dsv4_synthetic");
        if (syn && !(json_is_string(syn) && !strcmp(json_string_value(syn), "holes"))) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: dsv4_synthetic must be \"holes\"", what);
            goto done;
        }
        cfg->synthetic_holes = syn != NULL;
    }
    NUM_FIELD(cfg->synthetic_route_skew, "dsv4_route_skew", NULL, 0.0, 0);
    if (!(cfg->synthetic_route_skew >= 0 && cfg->synthetic_route_skew <= 10)) {
        rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: dsv4_route_skew must be a number from 0 to 10", what);
        goto done;
    }
    INT_FIELD(cfg->bos_id, "bos_token_id", NULL, 0, 0);
    INT_FIELD(cfg->eos_id, "eos_token_id", NULL, 1, 0);
    INT_FIELD(cfg->dspark_block_size, "dspark_block_size", NULL, 0, 0);
    INT_FIELD(cfg->dspark_noise_token, "dspark_noise_token_id", NULL, 0, 0);
    INT_FIELD(cfg->dspark_markov_rank, "dspark_markov_rank", NULL, 0, 0);

    /* expert dtype: HF "expert_dtype" or official "expert_dtype"; default fp4 (the release format) */
    {
        json_t *v = field(root, "expert_dtype", NULL);
        cfg->expert_fp4 = 1;
        if (v) {
            if (!json_is_string(v)) { rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: expert_dtype must be a string", what); goto done; }
            const char *s = json_string_value(v);
            if (!strcmp(s, "fp8")) cfg->expert_fp4 = 0;
            else if (strcmp(s, "fp4")) { rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: expert_dtype \"%s\" is not fp4 or fp8", what, s); goto done; }
        }
    }

    /* RoPE scaling (YaRN): HF rope_scaling / rope_parameters object, or official flat fields. */
    {
        json_t *rs = field(root, "rope_scaling", "rope_parameters");
        json_t *src = (rs && json_is_object(rs)) ? rs : root;
        json_t *saved = root;
        root = src;
        NUM_FIELD(cfg->rope_factor, "factor", "rope_factor", 1.0, 0);
        {
            int64_t v;
            if ((rc = get_int(root, "original_max_position_embeddings", "original_seq_len", 0, 0, &v, what, err))) { root = saved; goto done; }
            cfg->original_seq_len = v;
        }
        NUM_FIELD(cfg->beta_fast, "beta_fast", NULL, 32.0, 0);
        NUM_FIELD(cfg->beta_slow, "beta_slow", NULL, 1.0, 0);
        root = saved;
        if (!rs && !json_object_get(root, "original_seq_len")) cfg->original_seq_len = 0;
    }

    /* compress_ratios: one per backbone layer, then one per speculative stage (missing stages -> 0). */
    {
        json_t *cr = field(root, "compress_ratios", NULL);
        /* Each count on its own first: a negative stage count used to let num_hidden_layers exceed the
         * compress_ratio[] table (the sum fitted), and the sum of two large counts overflowed an int.
         * (The invariant is checked by tests/fuzz/fuzz_config.c; regressions/config/negative-mtp-*.json.) */
        if (cfg->n_layers <= 0 || cfg->n_layers > DSV4_MAX_LAYERS || cfg->n_mtp < 0 ||
            cfg->n_mtp > DSV4_MAX_LAYERS - cfg->n_layers) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: num_hidden_layers %d with %d MTP layers out of range (1..%d in all)",
                           what, cfg->n_layers, cfg->n_mtp, DSV4_MAX_LAYERS);
            goto done;
        }
        int total = cfg->n_layers + cfg->n_mtp;
        if (!cr) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: missing field \"compress_ratios\" (the layer layout must be explicit)", what);
            goto done;
        }
        if (!json_is_array(cr) || (int)json_array_size(cr) < cfg->n_layers) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: compress_ratios must be an array of at least %d entries", what,
                           cfg->n_layers);
            goto done;
        }
        /* A 0731 config says 1 MTP layer but lists 3 DSpark stages: trust the list when it is longer. */
        int listed = (int)json_array_size(cr);
        if (listed > total && listed <= DSV4_MAX_LAYERS) { cfg->n_mtp = listed - cfg->n_layers; total = listed; }
        for (int i = 0; i < total; i++) {
            json_t *e = i < listed ? json_array_get(cr, (size_t)i) : NULL;
            int r = e ? (int)json_integer_value(e) : 0;
            if (e && !json_is_integer(e)) r = -1;
            if (r != 0 && r != 4 && r != 128) {
                rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: compress_ratios[%d] must be 0, 4 or 128", what, i);
                goto done;
            }
            cfg->compress_ratio[i] = r;
        }
    }
    {
        json_t *tl = field(root, "dspark_target_layer_ids", NULL);
        if (tl && json_is_array(tl)) {
            size_t n = json_array_size(tl);
            if (n > 8) n = 8;
            for (size_t i = 0; i < n; i++) cfg->dspark_target_layers[i] = (int)json_integer_value(json_array_get(tl, i));
            cfg->n_dspark_targets = (int)n;
        }
    }
    rc = dsv4_config_validate(cfg, err);
    if (rc) dsv4_wrap(err, "%s", what);
done:
    json_decref(doc);
    return rc;
}

int dsv4_config_validate(const dsv4_config *c, dsv4_error *err) {
#define REQ(cond, ...) do { if (!(cond)) return dsv4_fail(err, DSV4_E_FORMAT, __VA_ARGS__); } while (0)
    REQ(c->vocab_size > 0, "vocab_size must be positive");
    REQ(c->dim > 0 && c->dim % 2 == 0, "hidden_size must be positive and even");
    REQ(c->n_heads > 0, "num_attention_heads must be positive");
    REQ(c->rope_dim > 0 && c->rope_dim % 2 == 0 && c->rope_dim <= c->head_dim,
        "qk_rope_head_dim must be even and at most head_dim");
    REQ(c->q_lora > 0 && c->o_lora > 0, "q_lora_rank and o_lora_rank must be positive");
    REQ(c->o_groups > 0 && c->n_heads % c->o_groups == 0, "num_attention_heads must be a multiple of o_groups");
    /* Upper bounds on the sizes no tensor shape pins down. Each sizes memory or time per sequence or per token,
     * and without a bound a config could overflow int arithmetic (ring_len = window + max_spec), ask for
     * terabytes, or spin for hours (tests/fuzz/fuzz_checkpoint.c, regressions/checkpoint/). The bounds are far
     * above the released models (window 128, index_topk 512/1024, 20 Sinkhorn iterations). */
    REQ(c->window > 0 && c->window <= (1 << 20), "sliding_window must be in 1..1048576");
    REQ(c->n_routed > 0 && c->n_act > 0 && c->n_act <= c->n_routed,
        "num_experts_per_tok must be in 1..n_routed_experts");
    REQ(c->n_shared == 1, "n_shared_experts must be 1 (the official model asserts it)");
    REQ(c->moe_inter > 0, "moe_intermediate_size must be positive");
    REQ(c->n_hash >= 0 && c->n_hash <= c->n_layers, "num_hash_layers out of range");
    REQ(c->hc_mult >= 1 && c->hc_mult <= 8, "hc_mult must be in 1..8");
    REQ(c->hc_iters >= 1 && c->hc_iters <= 1000, "hc_sinkhorn_iters must be in 1..1000");
    REQ(c->index_head_dim > 0 && c->index_head_dim >= c->rope_dim && c->index_n_heads > 0,
        "index_head_dim must be at least qk_rope_head_dim");
    REQ(c->index_topk > 0 && c->index_topk <= (1 << 20), "index_topk must be in 1..1048576");
    REQ(c->max_position > 0, "max_position_embeddings must be positive");
    REQ(c->bos_id >= 0 && c->bos_id < c->vocab_size && c->eos_id >= 0 && c->eos_id < c->vocab_size,
        "bos/eos token ids must be inside the vocabulary");
    if (c->expert_fp4) REQ(c->dim % 32 == 0 && c->moe_inter % 32 == 0,
                           "FP4 experts need hidden_size and moe_intermediate_size divisible by 32");
    return 0;
#undef REQ
}

int dsv4_config_load(const char *dir, dsv4_config *cfg, dsv4_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    size_t len = 0;
    int rc = dsv4_read_file(path, &text, &len, err);
    if (rc) {
        snprintf(path, sizeof path, "%s/inference/config.json", dir);
        rc = dsv4_read_file(path, &text, &len, err);
        if (rc) return dsv4_fail(err, DSV4_E_IO, "%s: no config.json or inference/config.json", dir);
    }
    rc = dsv4_config_parse(text, path, cfg, err);
    free(text);
    return rc;
}
