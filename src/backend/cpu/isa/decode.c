/* Weight rows: decode into fp32, or dot against a vector without storing the decoded row. Both paths see
 * identical floats in identical lanes (see vec.h), so they agree bit for bit. Compiled once per instruction set
 * (isa.h); every copy gives the same bits. */
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "model/formats.h"
#include <string.h>

/* Safetensors packs tensors without alignment: a BF16 element may sit at an odd address. */
static inline uint16_t load_u16(const uint16_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

#ifdef DSV4_AVX512
/* e8m0_to_f32 inlined (a call per 32 FP4 weights showed in profiles); the same values. */
static inline float e8m0_f32(uint8_t b) {
    if (b == 0 || b == 255) return e8m0_to_f32(b);
    const uint32_t u = (uint32_t)b << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#endif

#ifndef DSV4_AVX2
/* The E2M1 values as the vector decoders produce them: code 8 (-0, invalid in weights) as +0. */
static const float e2m1_vec_value[16] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                          0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f };
#endif

static const uint8_t *fp8_scale_row(const dsv4_weight *w, int row) {
    return w->scale + (int64_t)((w->row0 + row) / 128) * w->scale_cols;
}
static const uint8_t *fp4_scale_row(const dsv4_weight *w, int row) {
    return w->scale + (int64_t)(w->row0 + row) * w->scale_cols;
}

#ifdef DSV4_AVX512
/* weight_decode_row with the AVX-512 decoders (the same floats as the AVX2 ones); 1 when the shape suits. */
static int decode_row_avx512(const dsv4_weight *w, int row, float *out) {
    const int n = w->cols;
    switch (w->fmt) {
    case WF_BF16: {
        if (n % 16) return 0;
        const uint16_t *src = (const uint16_t *)w->data + (int64_t)row * n;
        for (int i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, vec_bf16x16(src + i));
        return 1;
    }
    case WF_FP8: {
        if (n % 128) return 0;
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * n, *srow = fp8_scale_row(w, row);
        for (int i = 0; i < n; i += 128) {
            const uint8_t b = srow[i / 128];
            if (!e8m0_fold256_ok(b)) return 0;
            const __m512 s = _mm512_set1_ps(e8m0_f32(b) * 256.0f);
            for (int k = i; k < i + 128; k += 16) _mm512_storeu_ps(out + k, _mm512_mul_ps(vec_e4m3x16_raw(src + k), s));
        }
        return 1;
    }
    case WF_FP4: {
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * (n / 2), *srow = fp4_scale_row(w, row);
        const __m512 table = vec_e2m1_table_zmm();
        for (int i = 0; i < n; i += 32) {
            __m512 v[2];
            vec_e2m1x32_lut(src + i / 2, _mm512_mul_ps(table, _mm512_set1_ps(e8m0_f32(srow[i / 32]))), v);
            _mm512_storeu_ps(out + i, v[0]);
            _mm512_storeu_ps(out + i + 16, v[1]);
        }
        return 1;
    }
    default:
        return 0;
    }
}
#endif

void ISA_FN(weight_decode_row)(const dsv4_weight *w, int row, float *out) {
    const int n = w->cols;
    int i = 0;
#ifdef DSV4_AVX512
    if (decode_row_avx512(w, row, out)) return;
#endif
    switch (w->fmt) {
    case WF_F32:
        memcpy(out, (const float *)w->data + (int64_t)row * n, sizeof(float) * (size_t)n);
        return;
    case WF_BF16: {
        const uint16_t *src = (const uint16_t *)w->data + (int64_t)row * n;
#ifdef DSV4_AVX2
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, vec_bf16x8(src + i));
#endif
        for (; i < n; i++) out[i] = bf16_to_f32(load_u16(src + i));
        return;
    }
    case WF_FP8: {
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * n, *srow = fp8_scale_row(w, row);
#ifdef DSV4_AVX2
        for (; i + 128 <= n; i += 128) {
            const __m256 s = _mm256_set1_ps(e8m0_to_f32(srow[i / 128]));
            for (int k = i; k < i + 128; k += 8) _mm256_storeu_ps(out + k, _mm256_mul_ps(vec_e4m3x8(src + k), s));
        }
#endif
        for (; i < n; i++) out[i] = dsv4_e4m3_table[src[i]] * e8m0_to_f32(srow[i / 128]);
        return;
    }
    case WF_FP4: {   /* cols is a multiple of 32 (checked against the config at load) */
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * (n / 2), *srow = fp4_scale_row(w, row);
        for (; i < n; i += 32) {
#ifdef DSV4_AVX2
            __m256 v[4];
            vec_e2m1x32(src + i / 2, _mm256_set1_ps(0.5f * e8m0_to_f32(srow[i / 32])), v);
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(out + i + 8 * k, v[k]);
#else
            const float s = e8m0_to_f32(srow[i / 32]);
            for (int k = i; k < i + 32; k += 2) {
                out[k] = e2m1_vec_value[src[k / 2] & 15] * s;
                out[k + 1] = e2m1_vec_value[src[k / 2] >> 4] * s;
            }
#endif
        }
        return;
    }
    }
}

#ifdef DSV4_AVX512
/* The fused dots with AVX-512 decoding; same lanes, same order, same bits as the AVX2 ones below. Returns 1 and
 * the dot in *out when the row's shape suits it. */
static int dot_row_avx512(const dsv4_weight *w, int row, const float *x, float *out) {
    const int n = w->cols;
    __m512 z0 = _mm512_setzero_ps(), z1 = z0;
    switch (w->fmt) {
    case WF_BF16: {
        if (n % 32) return 0;
        const uint16_t *src = (const uint16_t *)w->data + (int64_t)row * n;
        for (int i = 0; i < n; i += 32) {
            z0 = _mm512_fmadd_ps(vec_bf16x16(src + i), _mm512_loadu_ps(x + i), z0);
            z1 = _mm512_fmadd_ps(vec_bf16x16(src + i + 16), _mm512_loadu_ps(x + i + 16), z1);
        }
        break;
    }
    case WF_FP8: {
        if (n % 128) return 0;
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * n, *srow = fp8_scale_row(w, row);
        for (int i = 0; i < n; i += 128) {
            const uint8_t b = srow[i / 128];
            if (e8m0_fold256_ok(b)) {   /* one multiplication for 256 and the scale (vec.h) */
                const __m512 s = _mm512_set1_ps(e8m0_f32(b) * 256.0f);
                for (int k = i; k < i + 128; k += 32) {
                    z0 = _mm512_fmadd_ps(_mm512_mul_ps(vec_e4m3x16_raw(src + k), s), _mm512_loadu_ps(x + k), z0);
                    z1 = _mm512_fmadd_ps(_mm512_mul_ps(vec_e4m3x16_raw(src + k + 16), s), _mm512_loadu_ps(x + k + 16), z1);
                }
                continue;
            }
            const __m512 s = _mm512_set1_ps(e8m0_f32(b));
            for (int k = i; k < i + 128; k += 32) {
                z0 = _mm512_fmadd_ps(_mm512_mul_ps(vec_e4m3x16(src + k), s), _mm512_loadu_ps(x + k), z0);
                z1 = _mm512_fmadd_ps(_mm512_mul_ps(vec_e4m3x16(src + k + 16), s), _mm512_loadu_ps(x + k + 16), z1);
            }
        }
        break;
    }
    case WF_FP4: {
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * (n / 2), *srow = fp4_scale_row(w, row);
        const __m512 table = vec_e2m1_table_zmm();
        for (int i = 0; i < n; i += 32) {
            __m512 v[2];   /* the table scaled once per 32 weights instead of two vectors scaled */
            vec_e2m1x32_lut(src + i / 2, _mm512_mul_ps(table, _mm512_set1_ps(e8m0_f32(srow[i / 32]))), v);
            z0 = _mm512_fmadd_ps(v[0], _mm512_loadu_ps(x + i), z0);
            z1 = _mm512_fmadd_ps(v[1], _mm512_loadu_ps(x + i + 16), z1);
        }
        break;
    }
    default:
        return 0;
    }
    *out = vec_reduce32_zmm(z0, z1);
    return 1;
}
#endif

float ISA_FN(weight_dot_row)(const dsv4_weight *w, int row, const float *x, float *scratch) {
#ifdef DSV4_AVX512
    float r;
    if (dot_row_avx512(w, row, x, &r)) return r;
#endif
#ifdef DSV4_AVX2
    const int n = w->cols;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    switch (w->fmt) {
    case WF_F32:
        return dot_f32((const float *)w->data + (int64_t)row * n, x, n);
    case WF_BF16: {
        const uint16_t *src = (const uint16_t *)w->data + (int64_t)row * n;
        for (; i + 32 <= n; i += 32) {
            a0 = _mm256_fmadd_ps(vec_bf16x8(src + i), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(vec_bf16x8(src + i + 8), _mm256_loadu_ps(x + i + 8), a1);
            a2 = _mm256_fmadd_ps(vec_bf16x8(src + i + 16), _mm256_loadu_ps(x + i + 16), a2);
            a3 = _mm256_fmadd_ps(vec_bf16x8(src + i + 24), _mm256_loadu_ps(x + i + 24), a3);
        }
        if (i < n) break;   /* a tail: take the decode path for the whole row, whose tail order is dot_f32's */
        return vec_reduce32(a0, a1, a2, a3);
    }
    case WF_FP8: {
        if (n % 128) break;
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * n, *srow = fp8_scale_row(w, row);
        for (; i < n; i += 128) {
            const __m256 s = _mm256_set1_ps(e8m0_to_f32(srow[i / 128]));
            for (int k = i; k < i + 128; k += 32) {
                a0 = _mm256_fmadd_ps(_mm256_mul_ps(vec_e4m3x8(src + k), s), _mm256_loadu_ps(x + k), a0);
                a1 = _mm256_fmadd_ps(_mm256_mul_ps(vec_e4m3x8(src + k + 8), s), _mm256_loadu_ps(x + k + 8), a1);
                a2 = _mm256_fmadd_ps(_mm256_mul_ps(vec_e4m3x8(src + k + 16), s), _mm256_loadu_ps(x + k + 16), a2);
                a3 = _mm256_fmadd_ps(_mm256_mul_ps(vec_e4m3x8(src + k + 24), s), _mm256_loadu_ps(x + k + 24), a3);
            }
        }
        return vec_reduce32(a0, a1, a2, a3);
    }
    case WF_FP4: {
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * (n / 2), *srow = fp4_scale_row(w, row);
        for (; i < n; i += 32) {
            __m256 v[4];
            vec_e2m1x32(src + i / 2, _mm256_set1_ps(0.5f * e8m0_to_f32(srow[i / 32])), v);
            a0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + i + 8), a1);
            a2 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + i + 16), a2);
            a3 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + i + 24), a3);
        }
        return vec_reduce32(a0, a1, a2, a3);
    }
    }
#endif
    ISA_FN(weight_decode_row)(w, row, scratch);
    return dot_f32(scratch, x, w->cols);
}
