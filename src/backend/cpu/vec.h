/* AVX2/F16C/FMA building blocks shared by the weight decoders and the dot products. Every fused
 * "decode and multiply" kernel feeds the FMAs with exactly the floats the row decoder would have stored, in the
 * same lanes and the same order, so a fused dot and decode-then-dot give the same bits. */
#ifndef DSV4_CPU_VEC_H
#define DSV4_CPU_VEC_H
#include <stdint.h>
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define DSV4_AVX2 1

/* 8 E4M3 bytes -> 8 floats. The 7 magnitude bits shifted into an fp16's exponent/mantissa fields give the value
 * divided by 2^8 (exponent bias 15 instead of 7) for normals and subnormals alike; F16C widens it exactly.
 * (The NaN codes 0x7f/0xff, invalid in weights, come out as +-480.) */
static inline __m256 vec_e4m3x8(const uint8_t *src) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)src));
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
    const __m128i mag = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7);
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(sign, mag)), _mm256_set1_ps(256.0f));
}

/* 16 bytes = 32 E2M1 codes (element 2i in the low nibble) -> 4 x 8 floats, times `half_scale` = 0.5 * scale
 * (the table holds 2 * value as int8 so that 1.5 is representable). (-0, invalid here, comes out as +0.) */
static inline void vec_e2m1x32(const uint8_t *src, __m256 half_scale, __m256 out[4]) {
    const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m128i bytes = _mm_loadu_si128((const __m128i *)src);
    const __m128i lo = _mm_and_si128(bytes, low4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
    const __m128i v0 = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi));
    const __m128i v1 = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(lo, hi));
    out[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), half_scale);
    out[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), half_scale);
    out[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), half_scale);
    out[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), half_scale);
}

/* 8 BF16 -> 8 floats. */
static inline __m256 vec_bf16x8(const uint16_t *src) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* The fixed reduction of the 32 lanes: (0-7 + 16-23) and (8-15 + 24-31), then those two, then a tree
 * within 8 lanes. */
static inline float vec_reduce32(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define DSV4_AVX512 1
/* AVX-512 forms of the same decoders, 16 lanes at a time. Two zmm accumulators hold exactly the 32 lanes of the
 * AVX2 code (zmm0 = lanes 0-15, zmm1 = lanes 16-31), each lane running the same FMA sequence, and
 * vec_reduce32_zmm adds them in vec_reduce32's order: the bits are the same, only fewer instructions decode. */
static inline __m512 vec_e4m3x16_raw(const uint8_t *src);
static inline __m512 vec_e4m3x16(const uint8_t *src) { return _mm512_mul_ps(vec_e4m3x16_raw(src), _mm512_set1_ps(256.0f)); }

/* The same fp16 bits as vec_e4m3x8 in three integer operations: the byte moved to the top of its 16-bit word
 * puts the sign at bit 15 and the magnitude at bits 8-14; an arithmetic shift right by one moves the
 * magnitude to bits 7-13 and copies the sign into bit 14, which the mask clears. Returns the value / 256. */
static inline __m512 vec_e4m3x16_raw(const uint8_t *src) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)src));
    const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1), _mm256_set1_epi16((short)0xbfff));
    return _mm512_cvtph_ps(h);
}

/* The FP8 scale as one multiplier: (v/256 * 256) * s == v/256 * (256 s) bit for bit, because v/256 * 256 and
 * 256 s are both exact, so each side is the single rounding of the same real product. 256 s must be finite:
 * the UE8M0 byte at most 246 (2^119); the caller keeps the two multiplications otherwise (never seen in real
 * checkpoints, whose scales are far below 1). */
static inline int e8m0_fold256_ok(uint8_t b) { return b <= 246; }

/* The E2M1 values; code 8 (-0, invalid in weights) as +0, as the AVX2 path produces. */
static inline __m512 vec_e2m1_table_zmm(void) {
    return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                          0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
}

/* 16 bytes = 32 E2M1 codes -> 2 x 16 floats looked up in `table` (the E2M1 values already multiplied by the
 * block scale: permuting then scaling and scaling the table then permuting give the same floats). The index of
 * element 2i is byte i, of element 2i+1 byte i >> 4: the 16-bit word b | b << 4 holds both nibbles in its low
 * bits of each byte, and vpermps reads only the low 4 bits of an index. */
static inline void vec_e2m1x32_lut(const uint8_t *src, __m512 table, __m512 out[2]) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)src));
    const __m256i b = _mm256_or_si256(w, _mm256_slli_epi16(w, 4));
    out[0] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(b)), table);
    out[1] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(b, 1)), table);
}

/* 16 bytes = 32 E2M1 codes -> 2 x 16 floats times scale. */
static inline void vec_e2m1x32_zmm(const uint8_t *src, __m512 scale, __m512 out[2]) {
    vec_e2m1x32_lut(src, _mm512_mul_ps(vec_e2m1_table_zmm(), scale), out);
}

static inline __m512 vec_bf16x16(const uint16_t *src) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* round_bf16 (formats.h) of 16 floats: round to nearest even in the integer bits; a NaN stays a NaN of its sign and
 * payload, made quiet. */
static inline __m512 vec_round_bf16_zmm(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __mmask16 nan = _mm512_cmp_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000),
                                                _MM_CMPINT_NLE);
    const __m512i bit = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), bit);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* The 16-lane tree: lanes j + j+8, j + j+4, j + j+2, j + j+1, lane 0 the sum. */
static inline float vec_reduce16_zmm(__m512 z) {
    const __m256 lo = _mm512_castps512_ps256(z);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1));
    const __m256 s = _mm256_add_ps(lo, hi);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* vec_reduce32's tree on 32 lanes in two zmm: lanes j + j+16 first ([a0+a2 | a1+a3]), then the 16-lane tree. */
static inline float vec_reduce32_zmm(__m512 z0, __m512 z1) { return vec_reduce16_zmm(_mm512_add_ps(z0, z1)); }

/* The 16-lane tree (vec_reduce16_zmm) of several vectors side by side. Each level is one vector add over two
 * vectors' halves brought together by shuffles, the first operand holding lane j and the second lane j + s, as the
 * one-vector tree adds them: the same adds of the same values, so the same bits, in ~3 instructions a sum instead of
 * ~8. vec_tree_sS is the level of lanes j + j+S: S = 8 and 4 move whole 128-bit quarters, 2 and 1 work inside them. */
static inline __m512 vec_tree_s8(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
static inline __m512 vec_tree_s4(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}
static inline __m512 vec_tree_s2(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
static inline __m512 vec_tree_s1(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The trees of v[0..8): lane 4k of the result holds v[k]'s sum, lane 4k + 1 v[k + 4]'s (k = 0..3; the other lanes
 * copies). */
static inline __m512 vec_tree16x8_zmm(const __m512 v[8]) {
    __m512 a[4], b[2];
    for (int k = 0; k < 4; k++) a[k] = vec_tree_s8(v[2 * k], v[2 * k + 1]);
    for (int k = 0; k < 2; k++) b[k] = vec_tree_s4(a[2 * k], a[2 * k + 1]);
    const __m512 c = vec_tree_s2(b[0], b[1]);
    return vec_tree_s1(c, c);
}

/* The trees of v[0..16): lane l of the result holds v[4 (l % 4) + l / 4]'s sum. */
static inline __m512 vec_tree16x16_zmm(const __m512 v[16]) {
    __m512 a[8], b[4], c[2];
    for (int k = 0; k < 8; k++) a[k] = vec_tree_s8(v[2 * k], v[2 * k + 1]);
    for (int k = 0; k < 4; k++) b[k] = vec_tree_s4(a[2 * k], a[2 * k + 1]);
    for (int k = 0; k < 2; k++) c[k] = vec_tree_s2(b[2 * k], b[2 * k + 1]);
    return vec_tree_s1(c[0], c[1]);
}

/* s[i] = vec_reduce16_zmm(v[i]) for i < n: blocks of 16 and 8 down the trees together, one permute putting a
 * block's sums in order (lane l of a block of 16 holds vector 4 (l % 4) + l / 4's, a block of 8 lanes 0-7 the
 * same order), the last n % 8 one by one. Inline, with n a constant, the vectors stay in registers. */
static inline __attribute__((always_inline)) void vec_reduce16_zmm_n(const __m512 *v, const int n, float *s) {
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, _mm512_permutexvar_ps(order, vec_tree16x16_zmm(v + i)));
    if (i + 8 <= n) {
        _mm256_storeu_ps(s + i, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, vec_tree16x8_zmm(v + i))));
        i += 8;
    }
    for (; i < n; i++) s[i] = vec_reduce16_zmm(v[i]);
}
#endif
#endif
#endif
