/* Weight rows: decode into fp32, or dot against a vector without storing the decoded row. Both paths see
 * identical floats in identical lanes (see vec.h), so they agree bit for bit. Compiled once per instruction set
 * (isa.h); every copy gives the same bits. */
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "model/formats.h"
#include "model/fp4_planes.h"
#include <stdlib.h>
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

/* A planes row (model/fp4_planes.h) for the paths that read the checkpoint's layout: the row unpacked into a
 * buffer (on the stack for every real shape), then the FP4 path on it. Only the fused and tile paths of the pair
 * order read planes directly; these are the other sets' and the fp32 readers' way, the same values. */
enum { PLANES_STACK_COLS = 8192 };
static void decode_planes_row(const dsv4_weight *w, int row, float *out) {
    uint8_t stack[PLANES_STACK_COLS / 2];
    uint8_t *buf = w->cols <= PLANES_STACK_COLS ? stack : malloc((size_t)w->cols / 2);
    if (!buf) {   /* cannot happen for real configs: zeros rather than a crash */
        memset(out, 0, sizeof(float) * (size_t)w->cols);
        return;
    }
    const dsv4_weight v = fp4_planes_row_view(w, row, buf);
    ISA_FN(weight_decode_row)(&v, 0, out);
    if (buf != stack) free(buf);
}

void ISA_FN(weight_decode_row)(const dsv4_weight *w, int row, float *out) {
    const int n = w->cols;
    int i = 0;
    if (w->fmt == WF_FP4P) {
        decode_planes_row(w, row, out);
        return;
    }
#ifdef DSV4_AVX512
    if (decode_row_avx512(w, row, out)) return;
#endif
    switch (w->fmt) {
    case WF_FP4P: return;   /* above */
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
    default:   /* FP4: fp4_dot_interleaved */
        return 0;
    }
    *out = vec_reduce32_zmm(z0, z1);
    return 1;
}

/* FP4 rows, with fewer shuffles per byte. The E2M1 codes of weights 16b .. 16b+15 are the 16 nibbles of 8 bytes:
 * dwords D0 (weights 0-7, nibble k = weight k) and D1 (weights 8-15). One broadcast load (a load-port operation,
 * no shuffle) puts D0 in the even dword lanes and D1 in the odd ones; shifting lane j right by 4 * (j >> 1) brings
 * weight e(j) = 8 * (j & 1) + (j >> 1) into its low nibble, which is all vpermps reads of an index. So lane j holds
 * weight e(j) instead of weight j: the activations are interleaved the same way once per call
 * (fp4_interleave_x), every lane still runs the FMA chain of one fixed weight class, and the accumulators are put
 * back in dot_f32's lane order before its reduction tree. Same lanes, same order, same bits; per 32 weights two
 * shifts and two vpermps instead of six shuffles. */
static inline __m512i fp4_lane_shifts(void) {
    return _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
}

/* xi[16g + j] = x[16g + e(j)] for every group of 16 (n a multiple of 32). */
static void fp4_interleave_x(const float *x, int n, float *xi) {
    const __m512i e = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    for (int i = 0; i < n; i += 16) _mm512_storeu_ps(xi + i, _mm512_permutexvar_ps(e, _mm512_loadu_ps(x + i)));
}

/* The block scales s[0..n) (UE8M0 bytes) as floats, 16 at a time (e8m0_f32's values; out has room for n rounded
 * up to 16). Out of line: the rare scalar fallback is a call, which the dot loop must not contain (its
 * accumulators would live in memory). */
__attribute__((noinline)) static void e8m0_to_f32_16s(const uint8_t *s, int n, float *out) {
    for (int k = 0; k < n; k += 16) {
        const __mmask16 m = n - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - k)) - 1);
        const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s + k));
        _mm512_storeu_ps(out + k, _mm512_castsi512_ps(_mm512_slli_epi32(b, 23)));
        /* 0 (2^-127, subnormal) and 255 (NaN) are not an exponent field: their values from the definition */
        __mmask16 odd = _mm512_mask_cmpeq_epi32_mask(m, b, _mm512_setzero_si512()) |
                        _mm512_mask_cmpeq_epi32_mask(m, b, _mm512_set1_epi32(255));
        for (; odd; odd &= odd - 1) {
            const int i = __builtin_ctz(odd);
            out[k + i] = e8m0_to_f32(s[k + i]);
        }
    }
}

/* nb blocks of 32 weights (16 bytes at p, scales sf, activations xp) into the two accumulators. */
static inline void fp4_blocks(const uint8_t *p, const float *xp, const float *sf, int nb, __m512 acc[2]) {
    const __m512 table = vec_e2m1_table_zmm();
    const __m512i shifts = fp4_lane_shifts();
    __m512 z0 = acc[0], z1 = acc[1];
    for (int b = 0; b < nb; b++, p += 16, xp += 32) {
        const __m512 t = _mm512_mul_ps(table, _mm512_set1_ps(sf[b]));   /* the table scaled once per 32 */
        uint64_t q0, q1;
        memcpy(&q0, p, 8);
        memcpy(&q1, p + 8, 8);
        const __m512i i0 = _mm512_srlv_epi32(_mm512_set1_epi64((long long)q0), shifts);
        const __m512i i1 = _mm512_srlv_epi32(_mm512_set1_epi64((long long)q1), shifts);
        z0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i0, t), _mm512_loadu_ps(xp), z0);
        z1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i1, t), _mm512_loadu_ps(xp + 16), z1);
    }
    acc[0] = z0;
    acc[1] = z1;
}

/* dot(row, x) for an FP4 row against xi = fp4_interleave_x(x). */
static float fp4_dot_interleaved(const dsv4_weight *w, int row, const float *xi) {
    enum { CHUNK = 256 };   /* blocks whose scales are converted at once: every row of the real shapes */
    const int nb = w->cols / 32;
    const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * (w->cols / 2), *srow = fp4_scale_row(w, row);
    __m512 acc[2] = { _mm512_setzero_ps(), _mm512_setzero_ps() };
    float sf[CHUNK];
    for (int c0 = 0; c0 < nb; c0 += CHUNK) {
        const int cn = nb - c0 < CHUNK ? nb - c0 : CHUNK;
        e8m0_to_f32_16s(srow + c0, cn, sf);
        fp4_blocks(src + (size_t)c0 * 16, xi + (size_t)c0 * 32, sf, cn, acc);
    }
    /* lane j holds class e(j): lane e of dot_f32's order is lane 2 (e & 7) + (e >> 3) here */
    const __m512i back = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return vec_reduce32_zmm(_mm512_permutexvar_ps(back, acc[0]), _mm512_permutexvar_ps(back, acc[1]));
}

/* FP8 rows the same way, still through fp16 (F16C widens subnormals at full speed; fp32 subnormals as
 * multiplication inputs cost microcode assists, measured 20x slower). The 16 bytes of weights 16g .. 16g+15
 * broadcast to both 128-bit halves of a ymm (a load-port operation); word lane u holds bytes 2 (u & 7) and
 * 2 (u & 7) + 1, and a left shift by 8 in the low half only brings byte p(u) = 2 (u & 7) + (u >> 3) to the top of
 * the word. From there vec_e4m3x16_raw's two operations give the fp16 of the value / 256 (the mask also clears
 * the other byte, still in the low bits of the high half's words), and F16C the fp32 in lane u. x is interleaved by p once per call; lane e of dot_f32's order is lane 8 (e & 1) + (e >> 1) here. */
static void fp8_interleave_x(const float *x, int n, float *xi) {
    const __m512i p = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int i = 0; i < n; i += 16) _mm512_storeu_ps(xi + i, _mm512_permutexvar_ps(p, _mm512_loadu_ps(x + i)));
}

/* 16 E4M3 bytes -> value / 256 in lane order p. */
static inline __m512 fp8_raw16_perm(const uint8_t *src, __m256i shifts) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)src));
    const __m256i top = _mm256_sllv_epi16(b, shifts);
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_srai_epi16(top, 1), _mm256_set1_epi16((short)0xbf80)));
}

/* dot(row, x) for an FP8 row (cols a multiple of 128) against xi = fp8_interleave_x(x). */
static float fp8_dot_interleaved(const dsv4_weight *w, int row, const float *xi) {
    const int n = w->cols;
    const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * n, *srow = fp8_scale_row(w, row);
    const __m256i shifts = _mm256_setr_epi16(8, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 z0 = _mm512_setzero_ps(), z1 = z0;
    for (int i = 0; i < n; i += 128) {
        const uint8_t b = srow[i / 128];
        if (e8m0_fold256_ok(b)) {   /* one multiplication for 256 and the scale (vec.h) */
            const __m512 s = _mm512_set1_ps(e8m0_f32(b) * 256.0f);
            for (int k = i; k < i + 128; k += 32) {
                z0 = _mm512_fmadd_ps(_mm512_mul_ps(fp8_raw16_perm(src + k, shifts), s), _mm512_loadu_ps(xi + k), z0);
                z1 = _mm512_fmadd_ps(_mm512_mul_ps(fp8_raw16_perm(src + k + 16, shifts), s), _mm512_loadu_ps(xi + k + 16), z1);
            }
            continue;
        }
        const __m512 s = _mm512_set1_ps(e8m0_f32(b)), s256 = _mm512_set1_ps(256.0f);
        for (int k = i; k < i + 128; k += 32) {
            const __m512 v0 = _mm512_mul_ps(fp8_raw16_perm(src + k, shifts), s256);
            const __m512 v1 = _mm512_mul_ps(fp8_raw16_perm(src + k + 16, shifts), s256);
            z0 = _mm512_fmadd_ps(_mm512_mul_ps(v0, s), _mm512_loadu_ps(xi + k), z0);
            z1 = _mm512_fmadd_ps(_mm512_mul_ps(v1, s), _mm512_loadu_ps(xi + k + 16), z1);
        }
    }
    const __m512i back = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    return vec_reduce32_zmm(_mm512_permutexvar_ps(back, z0), _mm512_permutexvar_ps(back, z1));
}
#endif

const float *ISA_FN(weight_dot_prepare)(const dsv4_weight *w, const float *x, float *buf) {
#ifdef DSV4_AVX512
    if (w->fmt == WF_FP4) {
        fp4_interleave_x(x, w->cols, buf);
        return buf;
    }
    if (w->fmt == WF_FP8 && w->cols % 128 == 0) {
        fp8_interleave_x(x, w->cols, buf);
        return buf;
    }
#endif
    (void)w, (void)x, (void)buf;
    return NULL;
}

float ISA_FN(weight_dot_prepared)(const dsv4_weight *w, int row, const float *xp) {
#ifdef DSV4_AVX512
    return w->fmt == WF_FP4 ? fp4_dot_interleaved(w, row, xp) : fp8_dot_interleaved(w, row, xp);
#else
    (void)w, (void)row, (void)xp;
    return 0.0f;   /* not reached: weight_dot_prepare returned NULL */
#endif
}

float ISA_FN(weight_dot_row)(const dsv4_weight *w, int row, const float *x, float *scratch) {
#ifdef DSV4_AVX512
    float r;
    if (dot_row_avx512(w, row, x, &r)) return r;
    const float *xp = ISA_FN(weight_dot_prepare)(w, x, scratch);
    if (xp) return ISA_FN(weight_dot_prepared)(w, row, xp);
#endif
#ifdef DSV4_AVX2
    const int n = w->cols;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    switch (w->fmt) {
    case WF_FP4P: break;   /* the row decoded below (decode_planes_row): the same floats and lanes */
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
