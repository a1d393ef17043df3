/* KV row storage formats. See kvrows.h for the layouts and why OFFICIAL mode is lossless. */
#include "state/kvrows.h"
#include "backend/cpu/kernels.h"
#include "model/formats.h"
#include "util/error.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#define FP8_BLOCK 64    /* spec §7.2 / §8.3: one scale per 64 non-rope dims */
#define FP4_BLOCK 32    /* spec §8.3: one scale per 32 indexer dims */

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* ---- formats and sizes ---------------------------------------------------------------------------------- */

size_t kv_row_bytes(int fmt, kv_row_kind kind, int width, int rope) {
    switch (fmt) {
    case DSV4_KV_F32: return 4 * (size_t)width;
    case DSV4_KV_BF16: return 2 * (size_t)width;
    case DSV4_KV_FP8:
        if (kind == KV_ROW_INDEX) return (size_t)ceil_div(width, 2) + (size_t)ceil_div(width, FP4_BLOCK);
        return (size_t)(width - rope) + (size_t)ceil_div(width - rope, FP8_BLOCK) + 2 * (size_t)rope;
    default: return 0;
    }
}

void kv_layout_init(kv_layout *l, int fmt, kv_row_kind kind, int width, int rope) {
    l->fmt = fmt;
    l->kind = kind;
    l->width = width;
    l->rope = kind == KV_ROW_MAIN ? rope : 0;
    l->nope = width - l->rope;
    l->bytes = kv_row_bytes(fmt, kind, width, l->rope);
}

const char *kv_format_name(int fmt) {
    switch (fmt) {
    case DSV4_KV_F32: return "f32";
    case DSV4_KV_BF16: return "bf16";
    case DSV4_KV_FP8: return "fp8";
    default: return NULL;
    }
}

int kv_format_parse(const char *name) {
    for (int f = DSV4_KV_F32; f <= DSV4_KV_FP8; f++)
        if (name && !strcmp(name, kv_format_name(f))) return f;
    return -1;
}

int kv_format_check(int fmt, int head_dim, int rope_dim, int index_head_dim, dsv4_error *err) {
    if (!kv_format_name(fmt)) return dsv4_fail(err, DSV4_E_ARG, "unknown KV storage format %d (f32 = 0, bf16 = 1, fp8 = 2)", fmt);
    if (fmt == DSV4_KV_F32) return 0;
    if (head_dim > KV_MAX_WIDTH || index_head_dim > KV_MAX_WIDTH)
        return dsv4_fail(err, DSV4_E_ARG, "KV storage %s supports rows of at most %d values (head_dim %d, index_head_dim %d)",
                         kv_format_name(fmt), KV_MAX_WIDTH, head_dim, index_head_dim);
    if (rope_dim < 0 || rope_dim > head_dim)
        return dsv4_fail(err, DSV4_E_ARG, "KV storage %s: rope dim %d outside 0..head_dim %d", kv_format_name(fmt), rope_dim, head_dim);
    return 0;
}

void kv_cost_of(int fmt, int n_layers, const int *ratio, int head_dim, int rope_dim, int index_head_dim, int window,
                kv_cost *out) {
    memset(out, 0, sizeof *out);
    out->main_row = kv_row_bytes(fmt, KV_ROW_MAIN, head_dim, rope_dim);
    out->index_row = kv_row_bytes(fmt, KV_ROW_INDEX, index_head_dim, 0);
    out->per_token_csa = (double)(out->main_row + out->index_row) / 4.0;
    out->per_token_hca = (double)out->main_row / 128.0;
    for (int L = 0; L < n_layers; L++) {
        if (ratio[L] == 4) out->per_token += out->per_token_csa;
        else if (ratio[L] == 128) out->per_token += out->per_token_hca;
    }
    out->ring_bytes = (double)n_layers * window * (double)out->main_row;
}

void kv_cost_report(void *f, const char *indent, int loaded, int n_layers, const int *ratio, int head_dim, int rope_dim,
                    int index_head_dim, int window) {
    for (int fmt = DSV4_KV_F32; fmt <= DSV4_KV_FP8; fmt++) {
        kv_cost k;
        kv_cost_of(fmt, n_layers, ratio, head_dim, rope_dim, index_head_dim, window, &k);
        fprintf((FILE *)f, "%skv %-4s %9.1f bytes per context token (CSA layer %.2f, HCA layer %.3f; rows %zu + %zu "
                "bytes), window rings %.2f MiB%s\n", indent, kv_format_name(fmt), k.per_token, k.per_token_csa,
                k.per_token_hca, k.main_row, k.index_row, k.ring_bytes / 1048576.0, fmt == loaded ? "  <- loaded" : "");
    }
}

/* ---- encode --------------------------------------------------------------------------------------------- */

/* UE8M0 byte of a power-of-two scale (its biased exponent), kept inside the finite range. */
static uint8_t e8m0_of(float s) {
    uint32_t e = (f2u(s) >> 23) & 0xff;
    return (uint8_t)(e == 0 ? 1 : e == 255 ? 254 : e);
}

static void put_bf16(uint8_t *dst, float x) {
    const uint16_t h = f32_to_bf16(x);
    memcpy(dst, &h, 2);
}

/* The official FP8 block rule (formats.c act_quant_fp8_inplace): amax floored at 1e-4, s = 2^ceil(log2(amax/448)). */
static void encode_fp8_block(const float *x, int len, uint8_t *codes, uint8_t *scale) {
    float amax = 1e-4f;
    for (int i = 0; i < len; i++) amax = fmaxf(amax, fabsf(x[i]));
    const uint8_t sb = e8m0_of(pow2_ceil(amax * (1.0f / 448.0f)));
    const float s = e8m0_to_f32(sb);
    for (int i = 0; i < len; i++) codes[i] = f32_to_e4m3(fminf(fmaxf(x[i] / s, -448.0f), 448.0f));
    *scale = sb;
}

/* The official FP4 block rule (act_quant_fp4_inplace): amax floored at 6 * 2^-126, s = 2^ceil(log2(amax/6)). */
static void encode_fp4_block(const float *x, int len, int first, uint8_t *packed, uint8_t *scale) {
    float amax = 6.0f * ldexpf(1.0f, -126);
    for (int i = 0; i < len; i++) amax = fmaxf(amax, fabsf(x[i]));
    const uint8_t sb = e8m0_of(pow2_ceil(amax / 6.0f));
    const float s = e8m0_to_f32(sb);
    for (int i = 0; i < len; i++) {
        const uint8_t code = f32_to_e2m1(fminf(fmaxf(x[i] / s, -6.0f), 6.0f));
        const int k = first + i;
        if (k & 1) packed[k / 2] = (uint8_t)(packed[k / 2] | code << 4);
        else packed[k / 2] = code;
    }
    *scale = sb;
}

void kv_encode(const kv_layout *l, const float *x, uint8_t *dst) {
    const int n = l->width;
    if (l->fmt == DSV4_KV_F32) {
        memcpy(dst, x, sizeof(float) * (size_t)n);
    } else if (l->fmt == DSV4_KV_BF16) {
        for (int i = 0; i < n; i++) put_bf16(dst + 2 * i, x[i]);
    } else if (l->kind == KV_ROW_INDEX) {
        uint8_t *scales = dst + ceil_div(n, 2);
        for (int b0 = 0; b0 < n; b0 += FP4_BLOCK) {
            const int len = n - b0 < FP4_BLOCK ? n - b0 : FP4_BLOCK;
            encode_fp4_block(x + b0, len, b0, dst, scales + b0 / FP4_BLOCK);
        }
    } else {
        const int N = l->nope;
        uint8_t *scales = dst + N, *rope = scales + ceil_div(N, FP8_BLOCK);
        for (int b0 = 0; b0 < N; b0 += FP8_BLOCK) {
            const int len = N - b0 < FP8_BLOCK ? N - b0 : FP8_BLOCK;
            encode_fp8_block(x + b0, len, dst + b0, scales + b0 / FP8_BLOCK);
        }
        for (int i = 0; i < l->rope; i++) put_bf16(rope + 2 * i, x[N + i]);
    }
}

/* ---- decode --------------------------------------------------------------------------------------------- */

static inline float get_bf16(const uint8_t *src) {
    uint16_t h;
    memcpy(&h, src, 2);
    return bf16_to_f32(h);
}

/* Element i of a bf16 or fp8 row (scalar path; exact). */
static inline float elem(const kv_layout *l, const uint8_t *row, int i) {
    if (l->fmt == DSV4_KV_BF16) return get_bf16(row + 2 * i);
    if (l->kind == KV_ROW_INDEX) {
        const uint8_t b = row[i / 2];
        const float s = e8m0_to_f32(row[ceil_div(l->width, 2) + i / FP4_BLOCK]);
        return e2m1_to_f32((uint8_t)(i & 1 ? b >> 4 : b & 15)) * s;
    }
    const int N = l->nope;
    if (i >= N) return get_bf16(row + N + ceil_div(N, FP8_BLOCK) + 2 * (i - N));
    return dsv4_e4m3_table[row[i]] * e8m0_to_f32(row[N + i / FP8_BLOCK]);
}

void kv_decode(const kv_layout *l, const uint8_t *src, float *out) {
    if (l->fmt == DSV4_KV_F32) {
        memcpy(out, src, sizeof(float) * (size_t)l->width);
        return;
    }
    for (int i = 0; i < l->width; i++) out[i] = elem(l, src, i);
}

#ifdef DSV4_AVX2
/* The fused readers handle main rows whose every 32-value chunk lies in one region (fp8 part in one scale
 * block, or the bf16 part): true for bf16 rows always, for fp8 rows when the non-rope width is a multiple of
 * 32 (448 in the official shapes). Others take the scalar path, which gives the same bits. */
static int fused_ok(const kv_layout *l) {
    if (l->kind != KV_ROW_MAIN) return 0;
    return l->fmt == DSV4_KV_BF16 || (l->fmt == DSV4_KV_FP8 && l->nope % 32 == 0);
}

/* Values i .. i+31 (i a multiple of 32, i + 32 <= width) of a row accepted by fused_ok. */
static inline void load32(const kv_layout *l, const uint8_t *row, int i, __m256 v[4]) {
    const uint8_t *src;
    if (l->fmt == DSV4_KV_FP8 && i < l->nope) {
        const __m256 s = _mm256_set1_ps(e8m0_to_f32(row[l->nope + i / FP8_BLOCK]));
        for (int k = 0; k < 4; k++) v[k] = _mm256_mul_ps(vec_e4m3x8(row + i + 8 * k), s);
        return;
    }
    src = l->fmt == DSV4_KV_BF16 ? row + 2 * i : row + l->nope + ceil_div(l->nope, FP8_BLOCK) + 2 * (i - l->nope);
    for (int k = 0; k < 4; k++) v[k] = vec_bf16x8((const uint16_t *)(const void *)(src + 16 * k));
}
#endif

/* Decode values [i0, i0 + n) into buf. */
void kv_decode_range(const kv_layout *l, const uint8_t *row, int i0, int n, float *buf) {
    if (l->fmt == DSV4_KV_F32) {
        memcpy(buf, (const float *)(const void *)row + i0, sizeof(float) * (size_t)n);
        return;
    }
    int i = 0;
#ifdef DSV4_AVX2
    if (fused_ok(l) && i0 % 32 == 0)
        for (; i + 32 <= n; i += 32) {
            __m256 v[4];
            load32(l, row, i0 + i, v);
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(buf + i + 8 * k, v[k]);
        }
#endif
    for (; i < n; i++) buf[i] = elem(l, row, i0 + i);
}

float kv_dot(const kv_layout *l, const float *q, const uint8_t *row) {
    const int n = l->width;
    if (l->fmt == DSV4_KV_F32) return dot_f32(q, (const float *)(const void *)row, n);
#ifdef DSV4_AVX2
    if (fused_ok(l)) {
        /* dot_f32's exact lane structure and order, fed with the decoded values */
        int i = 0;
        float tail = 0.0f;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, v[4];
        for (; i + 32 <= n; i += 32) {
            load32(l, row, i, v);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), v[0], a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), v[1], a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), v[2], a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), v[3], a3);
        }
        for (; i < n; i++) tail = fmaf(q[i], elem(l, row, i), tail);
        return vec_reduce32(a0, a1, a2, a3) + tail;
    }
#endif
    float buf[KV_MAX_WIDTH];
    kv_decode(l, row, buf);
    return dot_f32(q, buf, n);
}

void kv_axpy(const kv_layout *l, float a, const uint8_t *row, float *out) {
    const int n = l->width;
    if (l->fmt == DSV4_KV_F32) {
        kv_axpy_f32(a, (const float *)(const void *)row, out, n);
        return;
    }
    /* element-wise, so decoding in chunks changes nothing */
    float buf[256];
    for (int j0 = 0; j0 < n; j0 += 256) {
        const int len = n - j0 < 256 ? n - j0 : 256;
        kv_decode_range(l, row, j0, len, buf);
        kv_axpy_f32(a, buf, out + j0, len);
    }
}
