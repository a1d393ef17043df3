#include "model/tiny.h"
#include "model/synthetic.h"
#include "model/formats.h"
#include "model/safetensors_write.h"
#include "util/error.h"
#include "util/fileio.h"
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ==== random numbers ====================================================================================== */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void dsv4_rng_seed(dsv4_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
    r->has_spare = 0;
    r->spare = 0;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t dsv4_rng_u64(dsv4_rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double dsv4_rng_uniform(dsv4_rng *r) { return (double)(dsv4_rng_u64(r) >> 11) * 0x1.0p-53; }

double dsv4_rng_normal(dsv4_rng *r) {
    if (r->has_spare) { r->has_spare = 0; return r->spare; }
    double u1 = 1.0 - dsv4_rng_uniform(r), u2 = dsv4_rng_uniform(r);  /* u1 in (0, 1]: log(u1) is finite */
    double rad = sqrt(-2.0 * log(u1)), ang = 2.0 * M_PI * u2;
    r->spare = rad * sin(ang);
    r->has_spare = 1;
    return rad * cos(ang);
}

uint32_t dsv4_rng_below(dsv4_rng *r, uint32_t n) {
    /* Rejection of the incomplete top range keeps the result exactly uniform. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = dsv4_rng_u64(r); while (x >= limit);
    return (uint32_t)(x % n);
}

/* FNV-1a: a tensor's stream depends only on its name and the seed. */
static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static void rng_for_tensor(dsv4_rng *r, uint64_t seed, const char *name) {
    uint64_t x = seed;
    dsv4_rng_seed(r, splitmix64(&x) ^ name_hash(name));
}

/* ==== quantization ========================================================================================= */

/* The smallest power of two s with amax/s <= qmax, as a UE8M0 byte (127 + log2 s). pow2_ceil of the rounded
 * quotient can land one binade low when amax/qmax rounds down onto a power of two, hence the check. */
static uint8_t ue8m0_for(float amax, float qmax, float *s_out) {
    if (!(amax > 0.0f) || !isfinite(amax)) { *s_out = 1.0f; return 127; }
    float s = pow2_ceil(amax / qmax);
    while (amax / s > qmax) s *= 2.0f;
    int e = ilogbf(s);
    if (e < -126) e = -126;
    if (e > 127) e = 127;
    *s_out = ldexpf(1.0f, e);
    return (uint8_t)(127 + e);
}

/* E4M3 round-to-nearest-even with saturation to +-448: the same byte as f32_to_e4m3 for every input, computed
 * from the fp32 bit pattern instead of a table search (the writer quantizes billions of values for benchmark
 * models; the test checks the two agree). */
static inline uint8_t e4m3_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7f;                       /* NaN */
    float a;
    memcpy(&a, &u, 4);
    uint32_t code;
    if (a < 0.015625f) {
        code = (uint32_t)nearbyintf(a * 512.0f);             /* subnormals: multiples of 2^-9; 8 = 2^-6 */
    } else if (a >= 448.0f) {
        code = 0x7e;
    } else {
        /* keep 3 mantissa bits, RNE; a carry moves into the exponent; rebias 127 -> 7 */
        uint32_t r = u + 0x7ffffu + ((u >> 20) & 1u);
        code = (r >> 20) - (120u << 3);
        if (code > 0x7e) code = 0x7e;
    }
    return (uint8_t)(sign | code);
}

/* E2M1 nearest with ties to the even code, saturating at 6: the same code as f32_to_e2m1. The thresholds are the
 * midpoints 0.25 .. 5; at a midpoint the step is taken (>=) only when the upper code is even. */
static inline uint8_t e2m1_rne(float x) {
    const float a = fabsf(x);
    if (a != a) return 7;
    const uint8_t code = (uint8_t)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                                   (a >= 3.5f) + (a > 5.0f));
    return (uint8_t)((signbit(x) ? 8 : 0) | code);
}

void dsv4_quant_fp8_blocks(const float *w, int64_t O, int64_t I, uint8_t *q, uint8_t *scale) {
    const int64_t nbi = fp8_scale_dim(I);
    for (int64_t bo = 0; bo < O; bo += 128)
        for (int64_t bi = 0; bi < I; bi += 128) {
            int64_t eo = bo + 128 < O ? bo + 128 : O, ei = bi + 128 < I ? bi + 128 : I;
            float amax = 0.0f, s;
            for (int64_t o = bo; o < eo; o++)
                for (int64_t i = bi; i < ei; i++) amax = fmaxf(amax, fabsf(w[o * I + i]));
            scale[(bo / 128) * nbi + bi / 128] = ue8m0_for(amax, 448.0f, &s);
            const float inv = 1.0f / s;                      /* exact: s is a power of two */
            for (int64_t o = bo; o < eo; o++)
                for (int64_t i = bi; i < ei; i++) q[o * I + i] = e4m3_rne(w[o * I + i] * inv);
        }
}

void dsv4_quant_fp4_groups(const float *w, int64_t O, int64_t I, uint8_t *q, uint8_t *scale) {
    for (int64_t o = 0; o < O; o++)
        for (int64_t g = 0; g < I / 32; g++) {
            const float *x = w + o * I + g * 32;
            float amax = 0.0f, s;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
            scale[o * (I / 32) + g] = ue8m0_for(amax, 6.0f, &s);
            const float inv = 1.0f / s;
            uint8_t *dst = q + o * (I / 2) + g * 16;
            for (int i = 0; i < 16; i++)
                dst[i] = (uint8_t)(e2m1_rne(x[2 * i] * inv) | (e2m1_rne(x[2 * i + 1] * inv) << 4));
        }
}

/* ==== presets and config composition ====================================================================== */

typedef struct {
    const char *name;
    int n_layers, n_heads, o_groups, n_hash;
    double route_scale;
    int (*ratio_of_layer)(int layer);
} tiny_preset;

/* V4-Flash layout: two window-only layers, then CSA on even and HCA on odd layers (spec §1.2). */
static int flash_ratio(int L) { return L < 2 ? 0 : (L % 2 == 0 ? 4 : 128); }
/* V4-Pro layout: no window-only layer; layers 0 and 1 are HCA, then CSA on even and HCA on odd layers. */
static int pro_ratio(int L) { return L < 2 ? 128 : (L % 2 == 0 ? 4 : 128); }

static const tiny_preset presets[] = {
    {"flash-tiny", 6, 4, 2, 2, 1.5, flash_ratio},
    {"pro-tiny", 4, 8, 4, 3, 2.5, pro_ratio},
};

static const tiny_preset *find_preset(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

static json_t *ratios_json(const tiny_preset *p, int n_layers) {
    json_t *a = json_array();
    for (int L = 0; a && L < n_layers; L++) json_array_append_new(a, json_integer(p->ratio_of_layer(L)));
    return a;
}

/* The config.json of a preset, fields in the order of the official example checkpoint. */
static json_t *preset_config(const tiny_preset *p) {
    json_t *c = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:f, s:f,"
        " s:{s:s, s:i, s:i, s:i, s:i}, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i,"
        " s:s, s:s, s:b, s:f, s:f, s:i, s:i, s:f, s:i, s:f, s:I, s:i, s:i, s:b, s:s, s:s,"
        " s:{s:s, s:s, s:s, s:s, s:[i, i]}}",
        "architectures", "DeepseekV4ForCausalLM", "model_type", "deepseek_v4",
        "vocab_size", 512, "hidden_size", 256, "num_hidden_layers", p->n_layers,
        "num_attention_heads", p->n_heads, "num_key_value_heads", 1, "head_dim", 128, "qk_rope_head_dim", 64,
        "q_lora_rank", 128, "o_lora_rank", 128, "o_groups", p->o_groups, "sliding_window", 16,
        "compress_ratios", ratios_json(p, p->n_layers), "compress_rope_theta", 160000.0, "rope_theta", 10000.0,
        "rope_scaling", "type", "yarn", "factor", 16, "original_max_position_embeddings", 65536, "beta_fast", 32,
        "beta_slow", 1,
        "index_n_heads", 4, "index_head_dim", 128, "index_topk", 4, "moe_intermediate_size", 128,
        "n_routed_experts", 8, "n_shared_experts", 1, "num_experts_per_tok", 2, "num_hash_layers", p->n_hash,
        "scoring_func", "sqrtsoftplus", "topk_method", "noaux_tc", "norm_topk_prob", 1,
        "routed_scaling_factor", p->route_scale, "swiglu_limit", 10.0, "hc_mult", 4, "hc_sinkhorn_iters", 20,
        "hc_eps", 1e-6, "num_nextn_predict_layers", 0, "rms_norm_eps", 1e-6,
        "max_position_embeddings", (json_int_t)1048576, "bos_token_id", 0, "eos_token_id", 1,
        "tie_word_embeddings", 0, "torch_dtype", "bfloat16", "expert_dtype", "fp4",
        "quantization_config", "activation_scheme", "dynamic", "fmt", "e4m3", "quant_method", "fp8",
        "scale_fmt", "ue8m0", "weight_block_size", 128, 128);
    return c;
}

/* VALUE of --set is JSON; a bare word (fp8, yarn) is taken as a string for convenience. */
static json_t *parse_set_value(const char *key, const char *text, dsv4_error *err) {
    json_error_t jerr;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &jerr);
    if (v) return v;
    int bare = *text != 0;
    for (const char *c = text; *c; c++) bare &= isalnum((unsigned char)*c) || *c == '_' || *c == '-' || *c == '.';
    if (bare && !isdigit((unsigned char)text[0]) && text[0] != '-' && text[0] != '.') return json_string(text);
    dsv4_fail(err, DSV4_E_ARG, "--set %s: value '%s' is not valid JSON (%s)", key, text, jerr.text);
    return NULL;
}

/* Apply one "KEY=VALUE"; KEY may be a dotted path into nested objects. The top-level key is recorded in
 * user_keys so that derived fields never overwrite what the user asked for. */
static int apply_set(json_t *root, const char *kv, json_t *user_keys, dsv4_error *err) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) return dsv4_fail(err, DSV4_E_ARG, "--set expects KEY=VALUE, got '%s'", kv);
    char key[256];
    if ((size_t)(eq - kv) >= sizeof key) return dsv4_fail(err, DSV4_E_ARG, "--set: key too long");
    memcpy(key, kv, (size_t)(eq - kv));
    key[eq - kv] = 0;
    json_t *value = parse_set_value(key, eq + 1, err);
    if (!value) return err ? err->code : DSV4_E_ARG;
    json_t *obj = root;
    char *part = key, *dot;
    while ((dot = strchr(part, '.'))) {
        *dot = 0;
        if (!*part) { json_decref(value); return dsv4_fail(err, DSV4_E_ARG, "--set: empty component in key"); }
        if (obj == root) json_object_set_new(user_keys, part, json_true());
        json_t *child = json_object_get(obj, part);
        if (!child) { child = json_object(); json_object_set_new(obj, part, child); }
        if (!json_is_object(child)) {
            json_decref(value);
            return dsv4_fail(err, DSV4_E_ARG, "--set: field \"%s\" is not an object", part);
        }
        obj = child;
        part = dot + 1;
    }
    if (!*part) { json_decref(value); return dsv4_fail(err, DSV4_E_ARG, "--set: empty component in key"); }
    if (obj == root) json_object_set_new(user_keys, part, json_true());
    json_object_set_new(obj, part, value);
    return 0;
}

static int user_set(json_t *user_keys, const char *k) { return json_object_get(user_keys, k) != NULL; }

/* An integer field of the config, or -1 when it is absent or not an integer (the parser reports those). */
static int64_t int_field(json_t *root, const char *k) {
    json_t *v = json_object_get(root, k);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* Keep num_hidden_layers, compress_ratios and num_hash_layers consistent with whichever the user changed. */
static void derive_layout(json_t *root, const tiny_preset *p, json_t *user_keys) {
    json_t *cr = json_object_get(root, "compress_ratios");
    if (user_set(user_keys, "compress_ratios") && !user_set(user_keys, "num_hidden_layers") && json_is_array(cr))
        json_object_set_new(root, "num_hidden_layers", json_integer((json_int_t)json_array_size(cr)));
    int64_t n = int_field(root, "num_hidden_layers");
    if (user_set(user_keys, "num_hidden_layers") && !user_set(user_keys, "compress_ratios") && n >= 1 &&
        n <= DSV4_MAX_LAYERS)
        json_object_set_new(root, "compress_ratios", ratios_json(p, (int)n));
    int64_t h = int_field(root, "num_hash_layers");
    if (!user_set(user_keys, "num_hash_layers") && n >= 0 && h > n)
        json_object_set_new(root, "num_hash_layers", json_integer(n));
}

static void set_default(json_t *root, json_t *user_keys, const char *k, json_t *v) {
    if (user_set(user_keys, k)) json_decref(v);
    else json_object_set_new(root, k, v);
}

/* The fields a speculative head needs: stage count, one compress ratio (0) per stage, and for DSpark its
 * block size, noise token, Markov rank and the target layers whose outputs it reads (the last three). */
static void derive_spec_heads(json_t *root, dsv4_mtp_kind mtp, json_t *user_keys) {
    if (mtp == MTP_NONE) return;
    set_default(root, user_keys, "num_nextn_predict_layers", json_integer(mtp == MTP_V4 ? 1 : 3));
    int64_t n = int_field(root, "num_hidden_layers"), s = int_field(root, "num_nextn_predict_layers");
    int64_t vocab = int_field(root, "vocab_size");
    json_t *cr = json_object_get(root, "compress_ratios");
    if (n >= 1 && s >= 0 && n + s <= DSV4_MAX_LAYERS && json_is_array(cr))
        while ((int64_t)json_array_size(cr) < n + s) json_array_append_new(cr, json_integer(0));
    if (mtp != MTP_DSPARK) return;
    set_default(root, user_keys, "dspark_block_size", json_integer(5));
    set_default(root, user_keys, "dspark_noise_token_id", json_integer(vocab > 1 ? vocab - 1 : 0));
    set_default(root, user_keys, "dspark_markov_rank", json_integer(16));
    json_t *targets = json_array();
    for (int64_t L = n >= 3 ? n - 3 : 0; L < n; L++) json_array_append_new(targets, json_integer(L));
    set_default(root, user_keys, "dspark_target_layer_ids", targets);
}

/* Checks the generic config validation does not make but a DSpark checkpoint needs. */
static int check_dspark(const dsv4_config *c, dsv4_error *err) {
    if (c->dspark_block_size < 1) return dsv4_fail(err, DSV4_E_ARG, "dspark_block_size must be positive");
    if (c->dspark_markov_rank < 1) return dsv4_fail(err, DSV4_E_ARG, "dspark_markov_rank must be positive");
    if (c->dspark_noise_token < 0 || c->dspark_noise_token >= c->vocab_size)
        return dsv4_fail(err, DSV4_E_ARG, "dspark_noise_token_id %d is outside the vocabulary (%d)",
                         c->dspark_noise_token, c->vocab_size);
    if (c->n_dspark_targets < 1) return dsv4_fail(err, DSV4_E_ARG, "dspark_target_layer_ids is empty");
    for (int i = 0; i < c->n_dspark_targets; i++)
        if (c->dspark_target_layers[i] < 0 || c->dspark_target_layers[i] >= c->n_layers)
            return dsv4_fail(err, DSV4_E_ARG, "dspark_target_layer_ids[%d] = %d is not a backbone layer", i,
                             c->dspark_target_layers[i]);
    return 0;
}

int dsv4_tiny_config(const dsv4_tiny_opts *o, char **json_text, dsv4_config *cfg, dsv4_error *err) {
    const char *pname = o->preset ? o->preset : "flash-tiny";
    const tiny_preset *p = find_preset(pname);
    if (!p) return dsv4_fail(err, DSV4_E_ARG, "unknown preset '%s' (flash-tiny or pro-tiny)", pname);
    json_t *root = preset_config(p), *user_keys = json_object();
    if (!root || !user_keys) {
        json_decref(root);
        json_decref(user_keys);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    int rc = 0;
    for (int i = 0; i < o->n_sets && !rc; i++) rc = apply_set(root, o->sets[i], user_keys, err);
    if (!rc) {
        derive_layout(root, p, user_keys);
        derive_spec_heads(root, o->mtp, user_keys);
    }
    char *text = rc ? NULL : json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(15));
    json_decref(root);
    json_decref(user_keys);
    if (rc) return rc;
    if (!text) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    rc = dsv4_config_parse(text, "config (after --set)", cfg, err);
    if (!rc && o->mtp == MTP_DSPARK) rc = check_dspark(cfg, err);
    if (!rc) {
        /* The inventory decides whether the speculative head is expressible with this config. */
        dsv4_inventory inv;
        rc = dsv4_inventory_build(cfg, o->mtp, &inv, err);
        if (!rc) dsv4_inventory_free(&inv);
    }
    if (rc) { free(text); return rc; }
    size_t n = strlen(text);
    char *with_nl = realloc(text, n + 2);
    if (!with_nl) { free(text); return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); }
    with_nl[n] = '\n';
    with_nl[n + 1] = 0;
    *json_text = with_nl;
    return 0;
}

/* ==== tensor values ========================================================================================
 *
 * Tensors are generated in chunks of 128 rows. Chunk c of a tensor draws from its own stream, seeded by
 * (seed, tensor name, c): the bytes do not depend on sharding, write order or the number of threads, and a
 * 128-row chunk is exactly one row of FP8 scale blocks, so chunks quantize independently and run in parallel. */

#define CHUNK_ROWS 128

typedef struct {
    const dsv4_config    *cfg;
    const dsv4_inventory *inv;
    uint64_t              seed;
    int                   n_threads;
    uint8_t              *scratch;     /* quantized values when only a scale is wanted */
    size_t                scratch_cap;
    /* A quantized weight's scale tensor follows the weight in the inventory: keep it until asked for. */
    char                  scale_of[128];
    uint8_t              *scale;
    size_t                scale_cap, scale_len;
} tiny_gen;

static int grow(void **p, size_t *cap, size_t need, dsv4_error *err) {
    if (need <= *cap) return 0;
    void *np = realloc(*p, need);
    if (!np) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory (%zu bytes)", need);
    *p = np;
    *cap = need;
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static const dsv4_tensor_spec *find_spec(const dsv4_inventory *inv, const char *name) {
    for (int i = 0; i < inv->n; i++)
        if (!strcmp(inv->v[i].name, name)) return &inv->v[i];
    return NULL;
}

static void normals(dsv4_rng *r, float *x, size_t n, double mean, double std) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(mean + std * dsv4_rng_normal(r));
}

/* A router's selection bias (gate.bias, n = the routed experts): N(0, 0.1) each, and with a skew s > 0 (config
 * "dsv4_route_skew") also -s ln(1 + rank), the ranks 0 .. n-1 a random permutation of the experts, so that routing
 * favours a few experts of each layer, ids scattered (as a real model's routing on one kind of text does; the bias
 * decides selection only, never the weights, spec §5). A benchmark's skewed routing (issue 15): how much it
 * concentrates is measured, not assumed (`dsv4 profile`, `dsv4 inspect --expert-profile`). */
static void gate_bias_values(dsv4_rng *r, float *x, size_t n, float skew) {
    normals(r, x, n, 0.0, 0.1);
    if (!(skew > 0)) return;
    uint32_t *rank = malloc(n * sizeof *rank);
    if (!rank) return;   /* only a benchmark's tensor: the bias stays unskewed rather than the write failing */
    for (size_t i = 0; i < n; i++) rank[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {   /* Fisher-Yates */
        const size_t j = (size_t)(dsv4_rng_uniform(r) * (double)i) % i;
        const uint32_t t = rank[i - 1];
        rank[i - 1] = rank[j];
        rank[j] = t;
    }
    for (size_t i = 0; i < n; i++) x[i] -= (float)(skew * log1p((double)rank[i]));
    free(rank);
}

/* The distribution of a tensor, chosen by its role (spec §18: every parameter non-trivial). Linears, quantized
 * or not, are N(0, 1/fan_in) so activations stay O(1) through every layer and the logits are not flat. */
static void tensor_values(const dsv4_tensor_spec *t, int64_t cols, float skew, dsv4_rng *r, float *x, size_t n) {
    const char *nm = t->name;
    if (t->dtype == ST_F8_E4M3 || t->dtype == ST_I8) normals(r, x, n, 0.0, 1.0 / sqrt((double)cols));
    else if (ends_with(nm, "norm.weight")) normals(r, x, n, 1.0, 0.1);            /* RMSNorm gains around 1 */
    else if (!strcmp(nm, "embed.weight") || ends_with(nm, "markov_w1.weight")) normals(r, x, n, 0.0, 1.0);
    else if (strstr(nm, "hc_") && ends_with(nm, "_fn")) normals(r, x, n, 0.0, 1.0 / sqrt((double)cols));
    else if (strstr(nm, "hc_") && ends_with(nm, "_base")) normals(r, x, n, 0.0, 0.5);
    else if (strstr(nm, "hc_") && ends_with(nm, "_scale"))
        for (size_t i = 0; i < n; i++) x[i] = (float)(0.5 + dsv4_rng_uniform(r));
    else if (ends_with(nm, "attn_sink")) normals(r, x, n, 0.0, 1.0);
    else if (ends_with(nm, ".ape")) normals(r, x, n, 0.0, 0.5);
    else if (ends_with(nm, "gate.bias")) gate_bias_values(r, x, n, skew);
    else if (t->ndim == 2) normals(r, x, n, 0.0, 1.0 / sqrt((double)cols));
    else normals(r, x, n, 0.0, 0.1);
}

/* One tensor being generated: its logical [rows, cols] fp32 matrix and where each chunk's bytes go. */
typedef struct {
    const dsv4_tensor_spec *t;
    uint64_t  seed;
    int64_t   rows, cols;        /* logical values (FP4: cols = 2 x stored bytes per row) */
    int64_t   n_chunks;
    void     *out;               /* stored values */
    uint8_t  *scale;             /* FP8/FP4 scales, NULL otherwise */
    int       n_threads;
    int       failed;            /* a worker could not allocate its staging buffer */
    float     skew;              /* the config's dsv4_route_skew (gate_bias_values) */
} gen_job;

static void gen_chunk(gen_job *j, int64_t c, float *x) {
    const int64_t r0 = c * CHUNK_ROWS, r1 = r0 + CHUNK_ROWS < j->rows ? r0 + CHUNK_ROWS : j->rows;
    const size_t n = (size_t)((r1 - r0) * j->cols);
    dsv4_rng r;
    uint64_t mix = j->seed ^ name_hash(j->t->name);
    uint64_t cs = (uint64_t)c;
    dsv4_rng_seed(&r, splitmix64(&mix) ^ splitmix64(&cs));
    tensor_values(j->t, j->cols, j->skew, &r, x, n);
    switch (j->t->dtype) {
    case ST_F8_E4M3:
        dsv4_quant_fp8_blocks(x, r1 - r0, j->cols, (uint8_t *)j->out + r0 * j->cols,
                              j->scale + (r0 / 128) * fp8_scale_dim(j->cols));
        break;
    case ST_I8:
        dsv4_quant_fp4_groups(x, r1 - r0, j->cols, (uint8_t *)j->out + r0 * (j->cols / 2),
                              j->scale + r0 * (j->cols / 32));
        break;
    case ST_F32:
        memcpy((float *)j->out + r0 * j->cols, x, n * sizeof(float));
        break;
    default: { /* BF16 */
        uint16_t *h = (uint16_t *)j->out + r0 * j->cols;
        for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(x[i]);
    }
    }
}

typedef struct { gen_job *job; int tid; } gen_worker;

static void *gen_worker_main(void *arg) {
    gen_worker *w = arg;
    gen_job *j = w->job;
    float *x = malloc(sizeof *x * (size_t)(CHUNK_ROWS * j->cols));
    if (!x) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return NULL; }
    for (int64_t c = w->tid; c < j->n_chunks; c += j->n_threads) gen_chunk(j, c, x);
    free(x);
    return NULL;
}

/* Generate every chunk of a tensor, on up to n_threads threads (only when there is enough work to share). */
static int gen_tensor(tiny_gen *g, const dsv4_tensor_spec *t, void *out, uint8_t *scale, dsv4_error *err) {
    gen_job j = {.t = t, .seed = g->seed, .out = out, .scale = scale, .skew = g->cfg->synthetic_route_skew};
    j.rows = t->ndim == 2 ? t->shape[0] : 1;
    j.cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    if (t->dtype == ST_I8) j.cols *= 2;
    j.n_chunks = (j.rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    const int64_t per_thread = 1 << 20;   /* values; below this a thread costs more than it saves */
    int64_t want = j.rows * j.cols / per_thread;
    j.n_threads = (int)(want < 1 ? 1 : want < g->n_threads ? want : g->n_threads);
    if (j.n_threads > j.n_chunks) j.n_threads = (int)j.n_chunks;
    pthread_t th[64];
    gen_worker w[64];
    int started = 0;
    for (int i = 1; i < j.n_threads; i++) {
        w[i] = (gen_worker){&j, i};
        if (pthread_create(&th[i], NULL, gen_worker_main, &w[i]) != 0) break;
        started = i;
    }
    /* Threads that could not start leave their chunks to this thread: the result is the same either way. */
    w[0] = (gen_worker){&j, 0};
    if (started + 1 < j.n_threads) {
        for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
        j.n_threads = 1;
        gen_worker_main(&w[0]);
    } else {
        gen_worker_main(&w[0]);
        for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    }
    if (j.failed) return dsv4_fail(err, DSV4_E_NOMEM, "%s: out of memory", t->name);
    return 0;
}

/* A quantized weight (FP8 blocks or FP4 groups, by its stored dtype) into q; its scales go to the cache for
 * the .scale tensor that follows. */
static int quantized_weight(tiny_gen *g, const dsv4_tensor_spec *w, uint8_t *q, dsv4_error *err) {
    const int fp4 = w->dtype == ST_I8;
    const int64_t O = w->shape[0], I = fp4 ? 2 * w->shape[1] : w->shape[1];
    const size_t ns = fp4 ? (size_t)(O * (I / 32)) : (size_t)(fp8_scale_dim(O) * fp8_scale_dim(I));
    g->scale_of[0] = 0;
    int rc = grow((void **)&g->scale, &g->scale_cap, ns, err);
    if (!rc) rc = gen_tensor(g, w, q, g->scale, err);
    if (rc) return rc;
    snprintf(g->scale_of, sizeof g->scale_of, "%s", w->name);
    g->scale_len = ns;
    return 0;
}

static int scale_tensor(tiny_gen *g, const dsv4_tensor_spec *s, uint8_t *out, size_t nbytes, dsv4_error *err) {
    char wname[160];
    snprintf(wname, sizeof wname, "%.*s.weight", (int)(strlen(s->name) - strlen(".scale")), s->name);
    if (strcmp(g->scale_of, wname)) {
        const dsv4_tensor_spec *w = find_spec(g->inv, wname);
        if (!w) return dsv4_fail(err, DSV4_E_ARG, "scale %s has no weight %s in the inventory", s->name, wname);
        size_t qn = (size_t)(w->shape[0] * w->shape[1]);
        int rc = grow((void **)&g->scratch, &g->scratch_cap, qn, err);
        if (!rc) rc = quantized_weight(g, w, g->scratch, err);
        if (rc) return rc;
    }
    if (g->scale_len != nbytes) return dsv4_fail(err, DSV4_E_ARG, "scale %s: size mismatch", s->name);
    memcpy(out, g->scale, nbytes);
    return 0;
}

/* Hash-routing table: each token's row lists n_act distinct experts (a partial Fisher-Yates shuffle). */
static int tid2eid(tiny_gen *g, const dsv4_tensor_spec *t, int32_t *out, dsv4_error *err) {
    const int E = g->cfg->n_routed, k = (int)t->shape[1];
    if (k > E) return dsv4_fail(err, DSV4_E_ARG, "%s: %d experts per token but only %d experts", t->name, k, E);
    int32_t *perm = malloc(sizeof *perm * (size_t)E);
    if (!perm) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    for (int e = 0; e < E; e++) perm[e] = e;
    dsv4_rng r;
    rng_for_tensor(&r, g->seed, t->name);
    for (int64_t v = 0; v < t->shape[0]; v++)
        for (int j = 0; j < k; j++) {
            int pick = j + (int)dsv4_rng_below(&r, (uint32_t)(E - j));
            int32_t tmp = perm[j];
            perm[j] = perm[pick];
            perm[pick] = tmp;
            out[v * k + j] = perm[j];
        }
    free(perm);
    return 0;
}

static int fill_tensor(void *user, int index, void *buf, size_t nbytes, dsv4_error *err) {
    tiny_gen *g = user;
    const dsv4_tensor_spec *t = &g->inv->v[index];
    switch (t->dtype) {
    case ST_F8_E4M3:
    case ST_I8: return quantized_weight(g, t, buf, err);
    case ST_F8_E8M0: return scale_tensor(g, t, buf, nbytes, err);
    case ST_I32: return tid2eid(g, t, buf, err);
    case ST_BF16:
    case ST_F32: return gen_tensor(g, t, buf, NULL, err);
    default: return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: no generator for dtype %s", t->name, st_dtype_name(t->dtype));
    }
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

int dsv4_tiny_write_weights(const char *dir, const dsv4_config *cfg, dsv4_mtp_kind mtp, uint64_t seed,
                            int n_shards, dsv4_error *err) {
    dsv4_inventory inv;
    int rc = dsv4_inventory_build(cfg, mtp, &inv, err);
    if (rc) return rc;
    st_write_tensor *list = calloc((size_t)inv.n, sizeof *list);
    if (!list) { dsv4_inventory_free(&inv); return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); }
    for (int i = 0; i < inv.n; i++) {
        list[i].name = inv.v[i].name;
        list[i].dtype = inv.v[i].dtype;
        list[i].ndim = inv.v[i].ndim;
        for (int d = 0; d < inv.v[i].ndim; d++) list[i].shape[d] = inv.v[i].shape[d];
        list[i].hole = cfg->synthetic_holes && synthetic_hole_tensor(list[i].dtype, st_write_nbytes(&list[i]));
    }
    tiny_gen g = {.cfg = cfg, .inv = &inv, .seed = seed, .n_threads = online_cpus()};
    rc = st_write_sharded(dir, list, inv.n, n_shards ? n_shards : 2, fill_tensor, &g, err);
    free(g.scratch);
    free(g.scale);
    free(list);
    dsv4_inventory_free(&inv);
    return rc;
}

/* mkdir -p */
static int make_dirs(const char *dir, dsv4_error *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return dsv4_fail(err, DSV4_E_ARG, "path too long");
    for (char *p = path + 1; ; p++) {
        if (*p != '/' && *p) continue;
        char saved = *p;
        *p = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return dsv4_fail(err, DSV4_E_IO, "%s: %s", path, strerror(errno));
        *p = saved;
        if (!saved) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return dsv4_fail(err, DSV4_E_IO, "%s: not a directory", dir);
    return 0;
}

int dsv4_tiny_write(const char *dir, const dsv4_tiny_opts *o, dsv4_error *err) {
    char *text = NULL;
    dsv4_config cfg;
    int rc = dsv4_tiny_config(o, &text, &cfg, err);
    if (!rc) rc = make_dirs(dir, err);
    if (!rc) {
        /* A previous config.json must not describe the new shards while they are being written. */
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (unlink(path) != 0 && errno != ENOENT) rc = dsv4_fail(err, DSV4_E_IO, "%s: %s", path, strerror(errno));
    }
    if (!rc) rc = dsv4_tiny_write_weights(dir, &cfg, o->mtp, o->seed, o->n_shards, err);
    if (!rc) {
        /* config.json last: a folder whose writing was interrupted has no config and is never taken as usable. */
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", dir);
        rc = dsv4_write_file_atomic(path, text, strlen(text), err);
    }
    free(text);
    return rc;
}
