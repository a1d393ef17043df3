/* dsv4 tiny: the synthetic checkpoint writer. Written checkpoints must load through the real reader and pass
 * the inventory check for both presets and both speculative heads, be a pure function of the seed, and store
 * values exactly in the official formats (FP8 block rule, FP4 nibble order and group scales, distinct tid2eid). */
#define _XOPEN_SOURCE 700   /* nftw */
#define _DEFAULT_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/config.h"
#include "model/formats.h"
#include "model/inventory.h"
#include "model/safetensors.h"
#include "model/safetensors_write.h"
#include "model/tiny.h"
#include "util/fileio.h"

/* ---- helpers --------------------------------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static void make_tmpdir(char *buf, size_t n) {
    snprintf(buf, n, "/tmp/dsv4_test_tiny_XXXXXX");
    assert_non_null(mkdtemp(buf));
}

static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Write a checkpoint into <tmp>/<sub>; returns 0 or the writer's status. */
static int write_ckpt(const char *dir, const char *preset, uint64_t seed, dsv4_mtp_kind mtp, int shards,
                      const char *const *sets, int n_sets, dsv4_error *err) {
    dsv4_tiny_opts o = {.preset = preset, .seed = seed, .sets = sets, .n_sets = n_sets, .mtp = mtp,
                        .n_shards = shards};
    return dsv4_tiny_write(dir, &o, err);
}

/* Load dir and run the same validation a real checkpoint gets. */
static void assert_valid(const char *dir, dsv4_mtp_kind mtp, dsv4_config *cfg_out) {
    dsv4_error err = {0};
    dsv4_config cfg;
    st_archive a;
    dsv4_inventory inv;
    int rc = dsv4_config_load(dir, &cfg, &err);
    if (rc) fail_msg("config: %s", err.msg);
    rc = st_open_dir(dir, &a, &err);
    if (rc) fail_msg("open: %s", err.msg);
    rc = dsv4_inventory_build(&cfg, mtp, &inv, &err);
    if (rc) fail_msg("inventory: %s", err.msg);
    rc = dsv4_inventory_check(&inv, &a, &err);
    if (rc) fail_msg("check: %s", err.msg);
    assert_int_equal(inv.n, a.n_tensors);   /* exactly the inventory, nothing more */
    dsv4_inventory_free(&inv);
    st_close(&a);
    if (cfg_out) *cfg_out = cfg;
}

static char *slurp(const char *dir, const char *file, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *text = NULL;
    dsv4_error err;
    if (dsv4_read_file(path, &text, len, &err)) fail_msg("%s", err.msg);
    return text;
}

static int same_file(const char *d1, const char *d2, const char *file) {
    size_t n1, n2;
    char *a = slurp(d1, file, &n1), *b = slurp(d2, file, &n2);
    int same = n1 == n2 && !memcmp(a, b, n1);
    free(a);
    free(b);
    return same;
}

typedef struct { char dir[64]; } tmp_state;

static int setup_tmp(void **st) {
    tmp_state *t = calloc(1, sizeof *t);
    make_tmpdir(t->dir, sizeof t->dir);
    *st = t;
    return 0;
}
static int teardown_tmp(void **st) {
    tmp_state *t = *st;
    rm_tree(t->dir);
    free(t);
    return 0;
}

static void subdir(char *buf, size_t n, void **st, const char *name) {
    snprintf(buf, n, "%s/%s", ((tmp_state *)*st)->dir, name);
}

/* ---- checkpoints load and validate ------------------------------------------------------------------------ */

static void presets_validate(void **st) {
    const char *presets[2] = {"flash-tiny", "pro-tiny"};
    const dsv4_mtp_kind kinds[3] = {MTP_NONE, MTP_V4, MTP_DSPARK};
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 3; k++) {
            char dir[128];
            snprintf(dir, sizeof dir, "%s/%s-%d/nested", ((tmp_state *)*st)->dir, presets[p], k);
            dsv4_error err = {0};
            if (write_ckpt(dir, presets[p], 1, kinds[k], 2, NULL, 0, &err)) fail_msg("%s", err.msg);
            dsv4_config cfg;
            assert_valid(dir, kinds[k], &cfg);
            assert_int_equal(cfg.vocab_size, 512);
            assert_int_equal(cfg.dim, 256);
            if (p == 0) {
                const int want[6] = {0, 0, 4, 128, 4, 128};
                assert_int_equal(cfg.n_layers, 6);
                for (int L = 0; L < 6; L++) assert_int_equal(cfg.compress_ratio[L], want[L]);
                assert_int_equal(cfg.n_heads, 4);
                assert_int_equal(cfg.o_groups, 2);
                assert_int_equal(cfg.n_hash, 2);
                assert_true(cfg.route_scale == 1.5f);
            } else {
                const int want[4] = {128, 128, 4, 128};
                assert_int_equal(cfg.n_layers, 4);
                for (int L = 0; L < 4; L++) assert_int_equal(cfg.compress_ratio[L], want[L]);
                assert_int_equal(cfg.n_heads, 8);
                assert_int_equal(cfg.o_groups, 4);
                assert_int_equal(cfg.n_hash, 3);
                assert_true(cfg.route_scale == 2.5f);
            }
            assert_int_equal(cfg.window, 16);
            assert_int_equal(cfg.index_topk, 4);
            assert_int_equal(cfg.n_routed, 8);
            assert_int_equal(cfg.n_act, 2);
            assert_true(cfg.original_seq_len == 65536 && cfg.rope_factor == 16.0f);
            if (kinds[k] == MTP_V4) {
                assert_int_equal(cfg.n_mtp, 1);
                assert_int_equal(cfg.compress_ratio[cfg.n_layers], 0);
            }
            if (kinds[k] == MTP_DSPARK) {
                assert_int_equal(cfg.n_mtp, 3);
                assert_int_equal(cfg.dspark_block_size, 5);
                assert_true(cfg.dspark_noise_token >= 0 && cfg.dspark_noise_token < cfg.vocab_size);
                assert_int_equal(cfg.n_dspark_targets, 3);
                for (int i = 0; i < 3; i++) assert_int_equal(cfg.dspark_target_layers[i], cfg.n_layers - 3 + i);
                for (int s = 0; s < 3; s++) assert_int_equal(cfg.compress_ratio[cfg.n_layers + s], 0);
            }
        }
}

/* ---- determinism ------------------------------------------------------------------------------------------- */

static const char *const shard_files[] = {"config.json", "model.safetensors.index.json",
                                          "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

static void same_seed_same_bytes(void **st) {
    char a[128], b[128], c[128];
    subdir(a, sizeof a, st, "a");
    subdir(b, sizeof b, st, "b");
    subdir(c, sizeof c, st, "c");
    dsv4_error err = {0};
    assert_int_equal(write_ckpt(a, "flash-tiny", 7, MTP_DSPARK, 2, NULL, 0, &err), 0);
    assert_int_equal(write_ckpt(b, "flash-tiny", 7, MTP_DSPARK, 2, NULL, 0, &err), 0);
    assert_int_equal(write_ckpt(c, "flash-tiny", 8, MTP_DSPARK, 2, NULL, 0, &err), 0);
    for (int i = 0; i < 4; i++) assert_true(same_file(a, b, shard_files[i]));
    /* another seed: same config and layout, different values in both shards */
    assert_true(same_file(a, c, "config.json"));
    assert_true(same_file(a, c, "model.safetensors.index.json"));
    assert_false(same_file(a, c, shard_files[2]));
    assert_false(same_file(a, c, shard_files[3]));
    /* rewriting over an existing checkpoint gives the same bytes again */
    assert_int_equal(write_ckpt(a, "flash-tiny", 7, MTP_DSPARK, 2, NULL, 0, &err), 0);
    for (int i = 0; i < 4; i++) assert_true(same_file(a, b, shard_files[i]));
}

/* A tensor's bytes depend on the seed and its name only, not on how the checkpoint is sharded. */
static void sharding_keeps_values(void **st) {
    char a[128], b[128];
    subdir(a, sizeof a, st, "one");
    subdir(b, sizeof b, st, "five");
    dsv4_error err = {0};
    assert_int_equal(write_ckpt(a, "pro-tiny", 3, MTP_V4, 1, NULL, 0, &err), 0);
    assert_int_equal(write_ckpt(b, "pro-tiny", 3, MTP_V4, 5, NULL, 0, &err), 0);
    assert_valid(a, MTP_V4, NULL);
    assert_valid(b, MTP_V4, NULL);
    st_archive x, y;
    assert_int_equal(st_open_dir(a, &x, &err), 0);
    assert_int_equal(st_open_dir(b, &y, &err), 0);
    assert_int_equal(x.n_shards, 1);
    assert_int_equal(y.n_shards, 5);
    assert_int_equal(x.n_tensors, y.n_tensors);
    for (int i = 0; i < x.n_tensors; i++) {
        const st_tensor *t = st_find(&y, x.tensors[i].name);
        assert_non_null(t);
        assert_int_equal(t->nbytes, x.tensors[i].nbytes);
        assert_memory_equal(t->data, x.tensors[i].data, t->nbytes);
    }
    st_close(&x);
    st_close(&y);
}

/* ---- file format --------------------------------------------------------------------------------------------- */

static void file_layout(void **st) {
    char d[128];
    subdir(d, sizeof d, st, "fmt");
    dsv4_error err = {0};
    assert_int_equal(write_ckpt(d, "flash-tiny", 0, MTP_NONE, 2, NULL, 0, &err), 0);
    size_t total_data = 0;
    for (int k = 2; k < 4; k++) {
        size_t n;
        char *f = slurp(d, shard_files[k], &n);
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++) hlen |= (uint64_t)(uint8_t)f[i] << (8 * i);
        assert_int_equal(hlen % 8, 0);
        assert_true(8 + hlen <= n);
        total_data += n - 8 - hlen;
        json_t *h = json_loadb(f + 8, hlen, 0, NULL);
        assert_non_null(h);
        assert_string_equal(json_string_value(json_object_get(json_object_get(h, "__metadata__"), "format")), "pt");
        assert_string_equal(json_object_iter_key(json_object_iter(h)), "__metadata__");
        json_decref(h);
        free(f);
    }
    char *idx = slurp(d, "model.safetensors.index.json", NULL);
    json_t *j = json_loads(idx, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "metadata"), "total_size")), total_data);
    /* the official example's total: the writer reproduces the exact inventory of the flash-like test checkpoint */
    assert_int_equal(total_data, 8028816);
    assert_int_equal(json_object_size(json_object_get(j, "weight_map")), 498);
    json_decref(j);
    free(idx);
    /* no temporary files left behind */
    char tmpl[256];
    snprintf(tmpl, sizeof tmpl, "%s/model-00001-of-00002.safetensors.tmp.%ld", d, (long)getpid());
    assert_int_not_equal(access(tmpl, F_OK), 0);
}

/* ---- stored values --------------------------------------------------------------------------------------------- */

typedef struct { char dir[128]; st_archive a; dsv4_config cfg; } ckpt_state;

static int setup_ckpt(void **st) {
    ckpt_state *c = calloc(1, sizeof *c);
    make_tmpdir(c->dir, sizeof c->dir);
    dsv4_error err = {0};
    if (write_ckpt(c->dir, "flash-tiny", 11, MTP_DSPARK, 2, NULL, 0, &err)) return -1;
    if (dsv4_config_load(c->dir, &c->cfg, &err) || st_open_dir(c->dir, &c->a, &err)) return -1;
    *st = c;
    return 0;
}
static int teardown_ckpt(void **st) {
    ckpt_state *c = *st;
    st_close(&c->a);
    rm_tree(c->dir);
    free(c);
    return 0;
}

static const st_tensor *scale_of(const st_archive *a, const char *weight_name) {
    char s[160];
    snprintf(s, sizeof s, "%.*s.scale", (int)(strlen(weight_name) - strlen(".weight")), weight_name);
    return st_find(a, s);
}

/* Each 128x128 block's scale is the smallest power of two that fits: the largest |value|/scale lies in
 * [224, 448] (amax/s in (224, 448], and RNE keeps it there), no NaN codes, and dequantized weights have the
 * intended spread N(0, 1/fan_in). */
static void fp8_block_rule(void **st) {
    ckpt_state *c = *st;
    int checked = 0;
    for (int i = 0; i < c->a.n_tensors; i++) {
        const st_tensor *w = &c->a.tensors[i];
        if (w->dtype != ST_F8_E4M3) continue;
        const st_tensor *s = scale_of(&c->a, w->name);
        assert_non_null(s);
        const int64_t O = w->shape[0], I = w->shape[1], nbi = (I + 127) / 128;
        const uint8_t *q = w->data, *sc = s->data;
        double sum2 = 0;
        for (int64_t bo = 0; bo < O; bo += 128)
            for (int64_t bi = 0; bi < I; bi += 128) {
                float qmax = 0;
                for (int64_t o = bo; o < O && o < bo + 128; o++)
                    for (int64_t k = bi; k < I && k < bi + 128; k++) {
                        uint8_t b = q[o * I + k];
                        assert_int_not_equal(b & 0x7f, 0x7f);
                        qmax = fmaxf(qmax, fabsf(e4m3_to_f32(b)));
                        float v = e4m3_to_f32(b) * e8m0_to_f32(sc[(bo / 128) * nbi + bi / 128]);
                        sum2 += (double)v * v;
                    }
                if (qmax < 224.0f || qmax > 448.0f) fail_msg("%s block (%lld,%lld): max |q| = %g", w->name,
                                                             (long long)bo, (long long)bi, qmax);
            }
        double std = sqrt(sum2 / (double)(O * I)), want = 1.0 / sqrt((double)I);
        if (fabs(std / want - 1.0) > 0.15) fail_msg("%s: std %g, expected about %g", w->name, std, want);
        checked++;
    }
    assert_true(checked > 40);
}

/* FP4 experts: per 32-group scale with max |code| in {3, 4, 6} (amax/s in (3, 6]). */
static void fp4_group_rule(void **st) {
    ckpt_state *c = *st;
    int checked = 0;
    for (int i = 0; i < c->a.n_tensors; i++) {
        const st_tensor *w = &c->a.tensors[i];
        if (w->dtype != ST_I8) continue;
        const st_tensor *s = scale_of(&c->a, w->name);
        assert_non_null(s);
        const int64_t O = w->shape[0], I = 2 * w->shape[1];
        assert_int_equal(s->shape[0], O);
        assert_int_equal(s->shape[1], I / 32);
        const uint8_t *q = w->data, *sc = s->data;
        for (int64_t o = 0; o < O; o++)
            for (int64_t g = 0; g < I / 32; g++) {
                float m = 0;
                for (int k = 0; k < 16; k++) {
                    uint8_t b = q[o * (I / 2) + g * 16 + k];
                    m = fmaxf(m, fmaxf(fabsf(e2m1_to_f32(b & 15)), fabsf(e2m1_to_f32(b >> 4))));
                }
                assert_true(m >= 3.0f && m <= 6.0f);
                assert_true(sc[o * (I / 32) + g] > 100 && sc[o * (I / 32) + g] < 127);
            }
        checked++;
    }
    assert_int_equal(checked, 3 * 8 * (6 + 3));   /* w1/w2/w3 of 8 experts in 6 layers + 3 DSpark stages */
}

static void tid2eid_rows_distinct(void **st) {
    ckpt_state *c = *st;
    for (int L = 0; L < c->cfg.n_hash; L++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", L);
        const st_tensor *t = st_find(&c->a, name);
        assert_non_null(t);
        assert_int_equal(t->dtype, ST_I32);
        /* safetensors data is packed, as in the official files: read through memcpy, not an int32 pointer */
        const int64_t n = st_numel(t);
        int32_t *e = malloc(sizeof *e * (size_t)n);
        memcpy(e, t->data, t->nbytes);
        int used[8] = {0};
        for (int64_t v = 0; v < t->shape[0]; v++) {
            for (int j = 0; j < t->shape[1]; j++) {
                int32_t x = e[v * t->shape[1] + j];
                assert_true(x >= 0 && x < c->cfg.n_routed);
                used[x]++;
                for (int jj = 0; jj < j; jj++) assert_int_not_equal(x, e[v * t->shape[1] + jj]);
            }
        }
        free(e);
        for (int x = 0; x < 8; x++) assert_true(used[x] > 0);
    }
    assert_null(st_find(&c->a, "layers.2.ffn.gate.tid2eid"));
    assert_non_null(st_find(&c->a, "layers.2.ffn.gate.bias"));
}

static void f32_stats(const st_tensor *t, double *mean, double *std, float *mn, float *mx) {
    const int64_t n = st_numel(t);
    double s = 0, s2 = 0;
    *mn = INFINITY;
    *mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        float v;
        uint16_t h;
        if (t->dtype == ST_F32) memcpy(&v, (const char *)t->data + 4 * i, 4);
        else { memcpy(&h, (const char *)t->data + 2 * i, 2); v = bf16_to_f32(h); }
        s += v;
        s2 += (double)v * v;
        *mn = fminf(*mn, v);
        *mx = fmaxf(*mx, v);
    }
    *mean = s / (double)n;
    *std = sqrt(fmax(0.0, s2 / (double)n - *mean * *mean));
}

/* Parameters HF's init leaves at 0 or 1 must be non-trivial here (spec §18), and norms sit around 1. */
static void values_non_degenerate(void **st) {
    ckpt_state *c = *st;
    for (int i = 0; i < c->a.n_tensors; i++) {
        const st_tensor *t = &c->a.tensors[i];
        if (t->dtype != ST_F32 && t->dtype != ST_BF16) continue;
        double mean, std;
        float mn, mx;
        f32_stats(t, &mean, &std, &mn, &mx);
        const char *n = t->name;
        assert_true(isfinite(mn) && isfinite(mx));
        if (strstr(n, "norm.weight")) {
            assert_true(fabs(mean - 1.0) < 0.1 && std > 0.02 && mn > 0.3);
        } else if (strstr(n, "hc_") && strstr(n, "_scale")) {
            assert_true(mn >= 0.5f && mx < 1.5f);
        } else if (st_numel(t) >= 4) {
            assert_true(std > 0.01);   /* sinks, ape, biases, hc fn/base, matrices: spread, not constant */
        }
        if (strstr(n, "hc_") && strstr(n, "_fn")) {
            double want = 1.0 / sqrt((double)t->shape[1]);
            assert_true(std > 0.8 * want && std < 1.2 * want);
        }
        if (strstr(n, "attn_sink")) assert_true(mn != 0.0f || mx != 0.0f);
    }
    const st_tensor *e = st_find(&c->a, "embed.weight");
    double mean, std;
    float mn, mx;
    f32_stats(e, &mean, &std, &mn, &mx);
    assert_true(fabs(std - 1.0) < 0.05);
}

/* ---- quantizers on hand-worked inputs ------------------------------------------------------------------------- */

static void quantizers_by_hand(void **st) {
    (void)st;
    /* 2 x 3 block, amax 300: 300/448 < 1 -> s = 1 (byte 127); 300 -> 288 (E4M3 spacing 32 in [256, 512)) */
    const float w[6] = {1.0f, -2.0f, 0.5f, 300.0f, 0.0f, 3.0f};
    uint8_t q[6], s[1];
    dsv4_quant_fp8_blocks(w, 2, 3, q, s);
    assert_int_equal(s[0], 127);
    const uint8_t want[6] = {0x38, 0xc0, 0x30, 0x79, 0x00, 0x44};
    assert_memory_equal(q, want, 6);
    assert_true(e4m3_to_f32(q[3]) == 288.0f);
    /* amax exactly 448 * 2^-3 = 56: s = 2^-3 (byte 124), 56 -> 448 */
    const float w2[2] = {56.0f, -7.0f};
    dsv4_quant_fp8_blocks(w2, 1, 2, q, s);
    assert_int_equal(s[0], 124);
    assert_int_equal(q[0], 0x7e);
    assert_int_equal(q[1], 0xe6);   /* -7 / 2^-3 = -56 = -2^5 * 1.75: 0x80 | (5+7) << 3 | 6 */
    /* 130 columns: two column blocks; block 2 holds only columns 128, 129 */
    float w3[130] = {0};
    w3[0] = 1.0f;
    w3[129] = 0.001f;   /* 0.001/448 -> s = 2^-18 (byte 109) */
    uint8_t q3[130], s3[2];
    dsv4_quant_fp8_blocks(w3, 1, 130, q3, s3);
    assert_int_equal(s3[0], 119);   /* 1/448 -> 2^-8 */
    assert_int_equal(s3[1], 109);
    /* FP4: 32 inputs, amax 6 -> s = 1; x0 = 1 (code 2), x1 = -3 (code 13): byte 0 = 0xd2 (x0 in the low nibble) */
    float f[32] = {0};
    f[0] = 1.0f;
    f[1] = -3.0f;
    f[31] = 6.0f;
    uint8_t p[16], ps[1];
    dsv4_quant_fp4_groups(f, 1, 32, p, ps);
    assert_int_equal(ps[0], 127);
    assert_int_equal(p[0], 0xd2);
    assert_int_equal(p[15], 0x70);
    /* amax 0.75: 0.75/6 = 0.125 -> s = 2^-3 (byte 124); 0.75 -> 6 (code 7) */
    f[31] = 0.75f;
    f[0] = 0.0625f;  /* 0.5 -> code 1 */
    f[1] = -0.1875f; /* -1.5 -> code 11 */
    dsv4_quant_fp4_groups(f, 1, 32, p, ps);
    assert_int_equal(ps[0], 124);
    assert_int_equal(p[0], 0xb1);
    assert_int_equal(p[15], 0x70);
}

/* The quantizers encode with their own bit-level RNE; it must give exactly the bytes of formats.c's reference
 * encoders. With the block's amax pinned to 448 (FP8) or 6 (FP4) the scale is 1 and values are encoded as is. */
static void quantizers_match_reference_encoders(void **st) {
    (void)st;
    enum { N = 128 * 128 };
    static float w[N];
    static uint8_t q[N];
    uint8_t sc[32];
    dsv4_rng r;
    dsv4_rng_seed(&r, 99);
    const float special[] = {0.0f, -0.0f, 0.0009765625f, 0.0029296875f, 0.0146484375f, 0.015625f, 1.0625f,
                             1.1875f, 17.0f, 19.0f, 424.0f, 432.0f, 440.0f, 447.9f, 0.001953125f, 1e-30f,
                             -0.0146484375f, -432.0f, 240.0f, 248.0f, 0.013671875f, 0.0136f};
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < N; i++) {
            double mag = exp2(-14.0 + 23.0 * dsv4_rng_uniform(&r));   /* 2^-14 .. 2^9, clipped below */
            w[i] = (float)((dsv4_rng_uniform(&r) < 0.5 ? -1 : 1) * (mag > 447.0 ? 447.0 : mag));
        }
        for (size_t k = 0; k < sizeof special / sizeof special[0]; k++) w[1 + k] = special[k];
        w[0] = 448.0f;
        dsv4_quant_fp8_blocks(w, 128, 128, q, sc);
        assert_int_equal(sc[0], 127);
        for (int i = 0; i < N; i++)
            if (q[i] != f32_to_e4m3(w[i])) fail_msg("fp8 of %a: 0x%02x, reference 0x%02x", w[i], q[i], f32_to_e4m3(w[i]));
    }
    const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -5.0f, -0.0f, 6.0f, 0.1f};
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < N; i++) w[i] = (float)(12.0 * dsv4_rng_uniform(&r) - 6.0);
        for (int row = 0; row < N / 32; row++) w[row * 32] = 6.0f;
        for (size_t k = 0; k < sizeof ties / sizeof ties[0]; k++) w[1 + k] = ties[k];
        dsv4_quant_fp4_groups(w, N / 32, 32, q, q + N / 2);
        for (int i = 0; i < N; i++) {
            uint8_t code = (q[i / 2] >> (4 * (i & 1))) & 15, want = f32_to_e2m1(w[i]);
            if (code != want) fail_msg("fp4 of %a: %d, reference %d", w[i], code, want);
        }
    }
}

static void rng_is_deterministic(void **st) {
    (void)st;
    dsv4_rng a, b;
    dsv4_rng_seed(&a, 42);
    dsv4_rng_seed(&b, 42);
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) {
        double x = dsv4_rng_normal(&a);
        assert_true(x == dsv4_rng_normal(&b));
        s += x;
        s2 += x * x;
    }
    assert_true(fabs(s / 1e5) < 0.02 && fabs(s2 / 1e5 - 1.0) < 0.02);
    for (int i = 0; i < 1000; i++) assert_true(dsv4_rng_below(&a, 7) < 7);
    dsv4_rng_seed(&b, 43);
    assert_true(dsv4_rng_u64(&a) != dsv4_rng_u64(&b));
}

/* ---- overrides -------------------------------------------------------------------------------------------------- */

static void overrides_applied(void **st) {
    char d[128];
    dsv4_error err = {0};
    dsv4_config cfg;
    subdir(d, sizeof d, st, "ov1");
    const char *s1[] = {"compress_ratios=[0,4,128]", "sliding_window=8", "rope_scaling.factor=4",
                        "expert_dtype=fp8", "index_topk=2"};
    if (write_ckpt(d, "flash-tiny", 5, MTP_NONE, 3, s1, 5, &err)) fail_msg("%s", err.msg);
    assert_valid(d, MTP_NONE, &cfg);
    assert_int_equal(cfg.n_layers, 3);   /* follows the list's length */
    assert_int_equal(cfg.compress_ratio[0], 0);
    assert_int_equal(cfg.compress_ratio[1], 4);
    assert_int_equal(cfg.compress_ratio[2], 128);
    assert_int_equal(cfg.window, 8);
    assert_true(cfg.rope_factor == 4.0f && cfg.original_seq_len == 65536);
    assert_int_equal(cfg.expert_fp4, 0);
    assert_int_equal(cfg.index_topk, 2);

    subdir(d, sizeof d, st, "ov2");
    const char *s2[] = {"num_hidden_layers=9", "hidden_size=160", "moe_intermediate_size=96", "q_lora_rank=200"};
    if (write_ckpt(d, "flash-tiny", 5, MTP_V4, 2, s2, 4, &err)) fail_msg("%s", err.msg);
    assert_valid(d, MTP_V4, &cfg);
    const int want[10] = {0, 0, 4, 128, 4, 128, 4, 128, 4, 0};   /* the Flash pattern, then the MTP stage */
    assert_int_equal(cfg.n_layers, 9);
    for (int L = 0; L < 10; L++) assert_int_equal(cfg.compress_ratio[L], want[L]);
    assert_int_equal(cfg.dim, 160);

    /* fewer layers than the preset's hash layers: clamped; DSpark targets the last layers that exist */
    subdir(d, sizeof d, st, "ov3");
    const char *s3[] = {"compress_ratios=[4]", "dspark_markov_rank=8"};
    if (write_ckpt(d, "pro-tiny", 5, MTP_DSPARK, 2, s3, 2, &err)) fail_msg("%s", err.msg);
    assert_valid(d, MTP_DSPARK, &cfg);
    assert_int_equal(cfg.n_layers, 1);
    assert_int_equal(cfg.n_hash, 1);
    assert_int_equal(cfg.n_dspark_targets, 1);
    assert_int_equal(cfg.dspark_target_layers[0], 0);
    assert_int_equal(cfg.dspark_markov_rank, 8);
}

static void overrides_rejected(void **st) {
    char d[128];
    subdir(d, sizeof d, st, "bad");
    struct { const char *set; dsv4_mtp_kind mtp; const char *needle; } cases[] = {
        {"compress_ratios=[0,3]", MTP_NONE, "compress_ratios[1]"},
        {"hidden_size=[1,", MTP_NONE, "not valid JSON"},
        {"hidden_size=\"wide\"", MTP_NONE, "hidden_size"},
        {"num_attention_heads=3", MTP_NONE, "o_groups"},
        {"moe_intermediate_size=100", MTP_NONE, "divisible by 32"},
        {"num_experts_per_tok=9", MTP_NONE, "num_experts_per_tok"},
        {"vocab_size=0", MTP_NONE, "vocab_size"},
        {"noequals", MTP_NONE, "KEY=VALUE"},
        {"=3", MTP_NONE, "KEY=VALUE"},
        {"rope_theta.x=1", MTP_NONE, "not an object"},
        {"dspark_noise_token_id=512", MTP_DSPARK, "outside the vocabulary"},
        {"dspark_target_layer_ids=[0,6]", MTP_DSPARK, "not a backbone layer"},
        {"num_nextn_predict_layers=0", MTP_V4, "no MTP layer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsv4_error err = {0};
        const char *sets[1] = {cases[i].set};
        int rc = write_ckpt(d, "flash-tiny", 0, cases[i].mtp, 2, sets, 1, &err);
        if (rc == 0) fail_msg("--set %s was accepted", cases[i].set);
        if (!strstr(err.msg, cases[i].needle)) fail_msg("--set %s: message '%s' lacks '%s'", cases[i].set, err.msg,
                                                        cases[i].needle);
        assert_int_not_equal(access(d, F_OK), 0);   /* nothing written for a rejected config */
    }
    dsv4_error err = {0};
    assert_int_not_equal(write_ckpt(d, "huge-tiny", 0, MTP_NONE, 2, NULL, 0, &err), 0);
    assert_non_null(strstr(err.msg, "huge-tiny"));
    assert_int_not_equal(write_ckpt(d, "flash-tiny", 0, MTP_NONE, 100000, NULL, 0, &err), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(presets_validate, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(same_seed_same_bytes, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(sharding_keeps_values, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(file_layout, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(fp8_block_rule, setup_ckpt, teardown_ckpt),
        cmocka_unit_test_setup_teardown(fp4_group_rule, setup_ckpt, teardown_ckpt),
        cmocka_unit_test_setup_teardown(tid2eid_rows_distinct, setup_ckpt, teardown_ckpt),
        cmocka_unit_test_setup_teardown(values_non_degenerate, setup_ckpt, teardown_ckpt),
        cmocka_unit_test(quantizers_by_hand),
        cmocka_unit_test(quantizers_match_reference_encoders),
        cmocka_unit_test(rng_is_deterministic),
        cmocka_unit_test_setup_teardown(overrides_applied, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(overrides_rejected, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
