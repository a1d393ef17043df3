/* The pair order's kernels (backend/cpu/pairs.h states the order), compiled once per instruction set (isa.h).
 * Every set runs the order's steps as fp32 FMAs on the bf16 pairs ("emulated"); the avx512bf16 set also has
 * VDPBF16PS, which it takes for the tiles whose every (row, token) pairs_safe admits. The set itself is chosen
 * only on a CPU where pairs_selftest passed (isa.c). Same bits in every set. */
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/pairs.h"
#include "backend/cpu/tile.h"
#include "model/formats.h"
#include <stdlib.h>
#include <string.h>

#if defined(DSV4_AVX512) && defined(__AVX512BF16__)
#define PAIRS_DP 1
#endif

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* ---- exponent ranges (pairs.h) ---- */

/* The range of n bf16s, from the smallest and largest nonzero magnitude (15 bits: exponent, mantissa). */
static pairs_exp range_of_mags(unsigned lo_mag, unsigned hi_mag) {
    pairs_exp r = { 255, 0 };
    if (hi_mag == 0) return r;   /* all zero: no product, nothing to bound */
    r.lo = (lo_mag >> 7) == 0 ? PAIRS_EXP_BAD_LO : (int)(lo_mag >> 7);
    r.hi = (hi_mag >> 7) == 255 ? PAIRS_EXP_BAD_HI : (int)(hi_mag >> 7);
    return r;
}

static pairs_exp bf16_range(const uint16_t *v, int n) {
    unsigned lo = 0x7fff, hi = 0;
    int i = 0;
#ifdef DSV4_AVX512
    __m512i vlo = _mm512_set1_epi16(0x7fff), vhi = _mm512_setzero_si512();
    const __m512i mag_mask = _mm512_set1_epi16(0x7fff);
    for (; i + 32 <= n; i += 32) {
        const __m512i m = _mm512_and_si512(_mm512_loadu_si512((const void *)(v + i)), mag_mask);
        vlo = _mm512_mask_min_epu16(vlo, _mm512_test_epi16_mask(m, m), vlo, m);
        vhi = _mm512_max_epu16(vhi, m);
    }
    uint16_t l[32], h[32];
    _mm512_storeu_si512((void *)l, vlo);
    _mm512_storeu_si512((void *)h, vhi);
    for (int k = 0; k < 32; k++) lo = l[k] < lo ? l[k] : lo, hi = h[k] > hi ? h[k] : hi;
#endif
    for (; i < n; i++) {
        const unsigned m = v[i] & 0x7fffu;
        if (m && m < lo) lo = m;
        if (m > hi) hi = m;
    }
    return range_of_mags(lo, hi);
}

/* ---- weight rows -> bf16 (exact) ---- */

#ifdef DSV4_AVX512
/* The per-block constants of fp8_bf16x32 for scale byte S: the exponent addition of normal codes, and the 8
 * subnormal values (index = the 3 mantissa bits) already scaled. */
typedef struct {
    __m512i bias, sub;
} fp8_block_consts;

static inline fp8_block_consts fp8_block(int S) {
    static const uint16_t sub_values[32] = { 0, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60 };
    const __m512i sub_table = _mm512_loadu_si512((const void *)sub_values);
    fp8_block_consts c;
    c.bias = _mm512_set1_epi16((short)((S - 7) * 128));
    c.sub = _mm512_mask_add_epi16(sub_table, 0xfe, sub_table, _mm512_set1_epi16((short)((S - 127) * 128)));
    return c;
}

/* 32 E4M3 bytes of one block -> their 32 bf16s times the block's scale, in element order (fp8_row_bf16 below
 * says how). */
static inline __m512i fp8_bf16x32(const uint8_t *src, fp8_block_consts c) {
    /* sign-extended: bit 15 of each word is the byte's sign bit, the low 7 bits its magnitude */
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)src));
    const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7f));
    const __m512i normal = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), c.bias);
    const __mmask32 is_sub = _mm512_testn_epi16_mask(mag, _mm512_set1_epi16(0x78));
    const __m512i v = _mm512_mask_permutexvar_epi16(normal, is_sub, mag, c.sub);
    /* the sign (0xf8: A | (B & C), A = v, B = w, C = 0x8000); a zero-extended byte needed a shift more */
    return _mm512_ternarylogic_epi32(v, w, _mm512_set1_epi16((short)0x8000), 0xf8);
}

/* The E2M1 bf16 table of fp4_row_bf16 with the block's scale S added to the exponents of its nonzero entries, for
 * every S, as constants: a block's table is then one load (a load port) instead of a broadcast of S and an add (the
 * shuffle port that vpermw and the widening loads need too: on Intel cores one port takes all three). Entries
 * 16..31 repeat 0..15 (fp4_bf16x32's indices may carry a stray bit 4); S outside 2..252 wraps the exponent and is
 * never used (pairs_safe's fast range). */
#define FP4_E(v, S) (uint16_t)((v) + ((S) - 127) * 128)
#define FP4_16(S)                                                                                                    \
    0, FP4_E(0x3f00, S), FP4_E(0x3f80, S), FP4_E(0x3fc0, S), FP4_E(0x4000, S), FP4_E(0x4040, S), FP4_E(0x4080, S),    \
        FP4_E(0x40c0, S), 0, FP4_E(0xbf00, S), FP4_E(0xbf80, S), FP4_E(0xbfc0, S), FP4_E(0xc000, S), FP4_E(0xc040, S), \
        FP4_E(0xc080, S), FP4_E(0xc0c0, S)
#define FP4_ROW(S) { FP4_16(S), FP4_16(S) }   /* entries 16-31 repeat 0-15: vpermw's index bit 4 does not matter */
#define FP4_R4(S) FP4_ROW(S), FP4_ROW((S) + 1), FP4_ROW((S) + 2), FP4_ROW((S) + 3)
#define FP4_R16(S) FP4_R4(S), FP4_R4((S) + 4), FP4_R4((S) + 8), FP4_R4((S) + 12)
#define FP4_R64(S) FP4_R16(S), FP4_R16((S) + 16), FP4_R16((S) + 32), FP4_R16((S) + 48)
static _Alignas(64) const uint16_t fp4_scaled[256][32] = { FP4_R64(0), FP4_R64(64), FP4_R64(128), FP4_R64(192) };
#undef FP4_R64
#undef FP4_R16
#undef FP4_R4
#undef FP4_ROW
#undef FP4_16
#undef FP4_E

static inline __m512i fp4_table(int S) { return _mm512_load_si512((const void *)fp4_scaled[S]); }

/* 16 bytes = 32 E2M1 codes (element 2i in the low nibble of byte i) -> their bf16s from the scaled table. The 16
 * bytes are loaded into every 128-bit lane (a broadcast: the load unit's work, no shuffle); in lane L, word k
 * (element e = 8L + k) takes byte e / 2 zero-extended (vpshufb within the lane), odd elements shifted right by 4;
 * vpermw reads the low 5 bits of each word: the code, and for an even element the odd one's low bit as bit 4,
 * which the table's repeated upper half ignores. On Intel cores the 512-bit shuffles share one port: this takes
 * two of them (vpshufb, vpermw) and a shift, where a widening load and two logic operations took three uops. */
static inline __m512i fp4_bf16x32(const uint8_t *src, __m512i table) {
#define FP4_SEL(L) 4 * L, -128, 4 * L, -128, 4 * L + 1, -128, 4 * L + 1, -128, 4 * L + 2, -128, 4 * L + 2, -128, 4 * L + 3, -128, 4 * L + 3, -128
    static _Alignas(64) const int8_t sel[64] = { FP4_SEL(0), FP4_SEL(1), FP4_SEL(2), FP4_SEL(3) };
#undef FP4_SEL
    const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)src));
    const __m512i w = _mm512_shuffle_epi8(b, _mm512_load_si512((const void *)sel));
    const __m512i idx = _mm512_srlv_epi16(w, _mm512_set1_epi32(4 << 16));   /* odd words (the high halves) >> 4 */
    return _mm512_permutexvar_epi16(idx, table);
}
#endif


static inline uint16_t f32_bits_hi(float f) {   /* the bf16 of an f32 that is one (truncation = the value) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

#ifdef DSV4_AVX512
/* The smallest and largest of n scale bytes (n >= 1). */
static void scale_minmax(const uint8_t *s, int n, int *lo, int *hi) {
    __m512i vlo = _mm512_set1_epi8((char)0xff), vhi = _mm512_setzero_si512();
    for (int i = 0; i < n; i += 64) {
        const __mmask64 m = n - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
        const __m512i v = _mm512_maskz_loadu_epi8(m, s + i);
        vlo = _mm512_mask_min_epu8(vlo, m, vlo, v);
        vhi = _mm512_max_epu8(vhi, v);
    }
    const __m256i l = _mm256_min_epu8(_mm512_castsi512_si256(vlo), _mm512_extracti64x4_epi64(vlo, 1));
    const __m256i h = _mm256_max_epu8(_mm512_castsi512_si256(vhi), _mm512_extracti64x4_epi64(vhi, 1));
    __m128i l2 = _mm_min_epu8(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1));
    __m128i h2 = _mm_max_epu8(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    /* 16 bytes -> 1: the minimum of the bytes as words (zero-extended) by PHMINPOSUW, twice; the maximum as the
     * minimum of 255 - b */
    const __m128i zero = _mm_setzero_si128(), ff = _mm_set1_epi8((char)0xff);
    const int lo_a = _mm_extract_epi16(_mm_minpos_epu16(_mm_unpacklo_epi8(l2, zero)), 0);
    const int lo_b = _mm_extract_epi16(_mm_minpos_epu16(_mm_unpackhi_epi8(l2, zero)), 0);
    h2 = _mm_sub_epi8(ff, h2);
    const int hi_a = _mm_extract_epi16(_mm_minpos_epu16(_mm_unpacklo_epi8(h2, zero)), 0);
    const int hi_b = _mm_extract_epi16(_mm_minpos_epu16(_mm_unpackhi_epi8(h2, zero)), 0);
    *lo = imin(lo_a, lo_b);
    *hi = 255 - imin(hi_a, hi_b);
}

/* The bf16 bits of an E4M3 value times 2^(S-127): the byte's 7 magnitude bits shifted left by 4 are its
 * exponent and mantissa in bf16 position, with the exponent biased by 7 instead of 127, so adding
 * (S - 7) << 7 rebiases and scales at once. Subnormal codes (exponent 0) come from a table of their 8 values,
 * scaled by the same exponent addition. Exact while every result is a normal bf16: 10 <= S <= 246. (The NaN
 * codes, invalid in weights, come out as +-480 times the scale, as the fp32 vector decoders give them.)
 * Returns 0 when a block's scale is out of that range; else the range, from the scales: the values of a block
 * lie between 2^-9 (the smallest subnormal) and 448 < 2^9 times its scale. */
static int fp8_row_bf16(const uint8_t *src, const uint8_t *srow, int n, uint16_t *out, pairs_exp *range) {
    int smin, smax;
    scale_minmax(srow, (n + 127) / 128, &smin, &smax);
    if (smin < 10 || smax > 246) return 0;
    int i = 0;
    for (; i + 128 <= n; i += 128) {
        const fp8_block_consts c = fp8_block(srow[i / 128]);
        for (int k = i; k < i + 128; k += 32) _mm512_storeu_si512((void *)(out + k), fp8_bf16x32(src + k, c));
    }
    for (; i < n; i++) out[i] = f32_bits_hi(dsv4_e4m3_table[src[i]] * e8m0_to_f32(srow[i / 128]));
    if (range) range->lo = smin - 9, range->hi = smax + 8;
    return 1;
}

/* E2M1 codes through a 16-entry bf16 table whose nonzero entries get (S - 127) << 7 added per 32 weights
 * (fp4_table, fp4_bf16x32). Exact for
 * 2 <= S <= 252 (code 8, -0 and invalid in weights, comes out as +0 as in the fp32 decoders). The range: the
 * values lie between 0.5 and 6 < 2^3 times the block's scale. */
static int fp4_row_bf16(const uint8_t *src, const uint8_t *srow, int n, uint16_t *out, pairs_exp *range) {
    int smin, smax;
    scale_minmax(srow, n / 32, &smin, &smax);
    if (smin < 2 || smax > 252) return 0;
    for (int i = 0; i < n; i += 32)
        _mm512_storeu_si512((void *)(out + i), fp4_bf16x32(src + i / 2, fp4_table(srow[i / 32])));
    if (range) range->lo = smin - 1, range->hi = smax + 2;
    return 1;
}

/* Chunk j (columns 32 j .. 32 j + 31) of a planes group (model/fp4_planes.h) from its 32 words: each word shifted
 * right by 4 j leaves column 32 j + k's code in word k's low bits, and vpermw reads the low 5 (the table's upper
 * half repeats the lower). One shuffle a chunk, where the checkpoint's layout takes two (fp4_bf16x32); the same
 * bf16s. */
static inline __m512i fp4p_bf16x32(__m512i words, int j, __m512i table) {
    switch (j) {
    case 1: words = _mm512_srli_epi16(words, 4); break;
    case 2: words = _mm512_srli_epi16(words, 8); break;
    case 3: words = _mm512_srli_epi16(words, 12); break;
    default: break;
    }
    return _mm512_permutexvar_epi16(words, table);
}

/* fp4_row_bf16 for a planes row (n a multiple of 128): the same bf16s and range. */
static int fp4p_row_bf16(const uint8_t *src, const uint8_t *srow, int n, uint16_t *out, pairs_exp *range) {
    int smin, smax;
    if (n % 128) return 0;
    scale_minmax(srow, n / 32, &smin, &smax);
    if (smin < 2 || smax > 252) return 0;
    for (int i = 0; i < n; i += 128) {
        const __m512i words = _mm512_loadu_si512((const void *)(src + i / 2));
        for (int j = 0; j < 4; j++)
            _mm512_storeu_si512((void *)(out + i + 32 * j), fp4p_bf16x32(words, j, fp4_table(srow[(i + 32 * j) / 32])));
    }
    if (range) range->lo = smin - 1, range->hi = smax + 2;
    return 1;
}
#endif

pairs_exp ISA_FN(weight_row_bf16)(const dsv4_weight *w, int row, int c0, int nc, uint16_t *out, float *ftmp) {
    const int n = w->cols, nv = n - c0 < nc ? n - c0 : nc;   /* columns that exist */
    pairs_exp r;
    int ok = 0;
    switch (w->fmt) {
    case WF_BF16:
        memcpy(out, (const uint16_t *)w->data + (int64_t)row * n + c0, sizeof(uint16_t) * (size_t)nv);
        break;
#ifdef DSV4_AVX512
    case WF_FP8:
        ok = fp8_row_bf16((const uint8_t *)w->data + (int64_t)row * n + c0,
                          w->scale + (int64_t)((w->row0 + row) / 128) * w->scale_cols + c0 / 128, nv, out, &r);
        if (!ok) goto slow;
        break;
    case WF_FP4:
        ok = fp4_row_bf16((const uint8_t *)w->data + (int64_t)row * (n / 2) + c0 / 2,
                          w->scale + (int64_t)(w->row0 + row) * w->scale_cols + c0 / 32, nv, out, &r);
        if (!ok) goto slow;
        break;
    case WF_FP4P:
        ok = c0 % 128 == 0 && fp4p_row_bf16((const uint8_t *)w->data + (int64_t)row * (n / 2) + c0 / 2,
                                            w->scale + (int64_t)(w->row0 + row) * w->scale_cols + c0 / 32, nv, out, &r);
        if (!ok) goto slow;
        break;
    slow:
#endif
    default:
        /* the exact fp32 values truncated (bf16s for every real checkpoint's scales: the fast decoders above
         * give these bits wherever they apply, so how a row is cut into ranges never changes a value) */
        ISA_FN(weight_decode_row)(w, row, ftmp);
        for (int i = 0; i < nv; i++) out[i] = f32_bits_hi(ftmp[c0 + i]);
        break;
    }
    if (!ok) r = bf16_range(out, nv);
    memset(out + nv, 0, sizeof(uint16_t) * (size_t)(nc - nv));
    return r;
}

/* ---- tokens -> bf16 ---- */

void ISA_FN(pairs_fill)(const float *x, int ldx, cpu_pairs_tokens *b) {
    for (int t = 0; t < b->T; t++) {
        const float *xt = x + (int64_t)t * ldx;
        uint16_t *o = b->xb + (size_t)t * b->n32;
        int i = 0;
#ifdef DSV4_AVX512
        /* f32_to_bf16, 16 at a time (round to nearest even; NaN quieted) */
        for (; i + 16 <= b->cols; i += 16) {
            const __m512i u = _mm512_loadu_si512((const void *)(xt + i));
            const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
            __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
            const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                         _mm512_set1_epi32(0x7f800000));
            r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
            _mm256_storeu_si256((__m256i *)(o + i), _mm512_cvtepi32_epi16(r));
        }
#endif
        for (; i < b->cols; i++) o[i] = f32_to_bf16(xt[i]);
        memset(o + b->cols, 0, sizeof(uint16_t) * (size_t)(b->n32 - b->cols));
        b->range[t] = bf16_range(o, b->cols);
    }
}

/* ---- the tiles ---- */

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* L[0] after the halving tree of pairs.h. */
static inline float reduce16(float L[16]) {
    for (int s = 8; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) L[j] += L[j + s];
    return L[0];
}

#ifdef DSV4_AVX512
/* out[r * TILE_T + t] = vec_reduce16_zmm(acc[r][t]) (pairs.h's halving tree) for the NT tokens, all the trees
 * together by vec_reduce16_zmm_n (vec.h: the same adds; the sums one by one were ~17 % of a 6-token tile's time at
 * 2048 columns). acc is in out's layout when NT is TILE_T; else gathered first, which only renames registers. */
static ALWAYS_INLINE void tile_sums(__m512 acc[TILE_R][TILE_T], float *out, const int NT) {
    if (NT == TILE_T) {
        vec_reduce16_zmm_n(&acc[0][0], TILE_R * TILE_T, out);
        return;
    }
    __m512 v[TILE_R * TILE_T];
    float s[TILE_R * TILE_T];
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++) v[r * NT + t] = acc[r][t];
    vec_reduce16_zmm_n(v, TILE_R * NT, s);
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++) out[r * TILE_T + t] = s[r * NT + t];
}
#endif

#if defined(DSV4_AVX512) || defined(DSV4_AVX2)
/* The emulated steps on vectors of GL lanes: group g of a chunk is its dwords g*GL .. g*GL + GL-1 (lanes
 * g*GL..), the bf16 pair of a dword gives the odd column as its high half (AND) and the even one as its low half
 * (shift). AVX-512 has one group; AVX2 two, run one after the other per block of KBLOCK columns (a lane's chain
 * stays in increasing chunk order; the block keeps the tile's rows and tokens in L1 for the second group). */
#if defined(DSV4_AVX512)
typedef __m512 lane_vec;
typedef __m512i lane_ivec;
enum { GL = 16 };
#define lane_zero _mm512_setzero_ps
#define lane_fma _mm512_fmadd_ps
#define lane_iload(p) _mm512_loadu_si512((const void *)(p))
#define lane_odd(d) _mm512_castsi512_ps(_mm512_and_si512((d), _mm512_set1_epi32((int)0xffff0000u)))
#define lane_even(d) _mm512_castsi512_ps(_mm512_slli_epi32((d), 16))
#define lane_store _mm512_storeu_ps
#else
typedef __m256 lane_vec;
typedef __m256i lane_ivec;
enum { GL = 8 };
#define lane_zero _mm256_setzero_ps
#define lane_fma _mm256_fmadd_ps
#define lane_iload(p) _mm256_loadu_si256((const __m256i *)(p))
#define lane_odd(d) _mm256_castsi256_ps(_mm256_and_si256((d), _mm256_set1_epi32((int)0xffff0000u)))
#define lane_even(d) _mm256_castsi256_ps(_mm256_slli_epi32((d), 16))
#define lane_store _mm256_storeu_ps
#endif

static ALWAYS_INLINE void tile_emulated_n(const uint16_t *const w[TILE_R], const uint16_t *const x[TILE_T], int n32,
                                          float *out, const int NT) {
    enum { GROUPS = 16 / GL, KBLOCK = 512 };
    lane_vec part[TILE_R][TILE_T][GROUPS];
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++)
            for (int g = 0; g < GROUPS; g++) part[r][t][g] = lane_zero();
    for (int k0 = 0; k0 < n32; k0 += KBLOCK) {
        const int k1 = imin(n32, k0 + KBLOCK);
        for (int g = 0; g < GROUPS; g++) {
            lane_vec acc[TILE_R][TILE_T];
            for (int r = 0; r < TILE_R; r++)
                for (int t = 0; t < NT; t++) acc[r][t] = part[r][t][g];
            for (int c = k0 + 2 * GL * g; c < k1; c += 32) {
                lane_vec wv[TILE_R];
                for (int r = 0; r < TILE_R; r++) wv[r] = lane_odd(lane_iload(w[r] + c));
                for (int t = 0; t < NT; t++) {
                    const lane_vec xv = lane_odd(lane_iload(x[t] + c));
                    for (int r = 0; r < TILE_R; r++) acc[r][t] = lane_fma(wv[r], xv, acc[r][t]);
                }
                for (int r = 0; r < TILE_R; r++) wv[r] = lane_even(lane_iload(w[r] + c));
                for (int t = 0; t < NT; t++) {
                    const lane_vec xv = lane_even(lane_iload(x[t] + c));
                    for (int r = 0; r < TILE_R; r++) acc[r][t] = lane_fma(wv[r], xv, acc[r][t]);
                }
            }
            for (int r = 0; r < TILE_R; r++)
                for (int t = 0; t < NT; t++) part[r][t][g] = acc[r][t];
        }
    }
#if defined(DSV4_AVX512)
    __m512 sums[TILE_R][TILE_T];   /* GROUPS = 1: the tree in registers (tile_dp_n) */
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++) sums[r][t] = part[r][t][0];
    tile_sums(sums, out, NT);
#else
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++) {
            float L[16];
            for (int g = 0; g < GROUPS; g++) lane_store(L + GL * g, part[r][t][g]);
            out[r * TILE_T + t] = reduce16(L);
        }
#endif
}
#else
static ALWAYS_INLINE void tile_emulated_n(const uint16_t *const w[TILE_R], const uint16_t *const x[TILE_T], int n32,
                                          float *out, const int NT) {
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++) {
            float L[16] = {0};
            for (int c = 0; c < n32; c += 32)
                for (int j = 0; j < 16; j++) {
                    L[j] = fmaf(bf16_to_f32(w[r][c + 2 * j + 1]), bf16_to_f32(x[t][c + 2 * j + 1]), L[j]);
                    L[j] = fmaf(bf16_to_f32(w[r][c + 2 * j]), bf16_to_f32(x[t][c + 2 * j]), L[j]);
                }
            out[r * TILE_T + t] = reduce16(L);
        }
}
#endif

#ifdef PAIRS_DP
/* The same steps by VDPBF16PS: one instruction is a chunk's two steps on all 16 lanes. */
static ALWAYS_INLINE void tile_dp_n(const uint16_t *const w[TILE_R], const uint16_t *const x[TILE_T], int n32,
                                    float *out, const int NT) {
    __m512 acc[TILE_R][TILE_T];
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int c = 0; c < n32; c += 32) {
        __m512bh wv[TILE_R];
        for (int r = 0; r < TILE_R; r++) wv[r] = (__m512bh)_mm512_loadu_si512((const void *)(w[r] + c));
        for (int t = 0; t < NT; t++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(x[t] + c));
            for (int r = 0; r < TILE_R; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
        }
    }
    /* the tree in registers: through memory (a 64-byte store, then 4-byte loads of it) it took ~30 % of the tile's
     * time at 128 tokens, more than the chunks' loads; the sums of all the tile's outputs together */
    tile_sums(acc, out, NT);
}
#endif

/* One tile of TILE_R rows x nt <= TILE_T tokens (out[r * TILE_T + t]); a variant per nt so that the
 * accumulators stay in registers. */
static void tile_pairs(const uint16_t *const w[TILE_R], const uint16_t *const x[TILE_T], int n32, int nt, int dp,
                       float *out) {
#ifdef PAIRS_DP
#define TILE_CASE(N) case N: if (dp) tile_dp_n(w, x, n32, out, N); else tile_emulated_n(w, x, n32, out, N); return;
#else
#define TILE_CASE(N) case N: tile_emulated_n(w, x, n32, out, N); return;
    (void)dp;
#endif
    switch (nt) {
    TILE_CASE(1)
#if TILE_T >= 2
    TILE_CASE(2)
#endif
#if TILE_T >= 3
    TILE_CASE(3)
#endif
#if TILE_T >= 4
    TILE_CASE(4)
#endif
#if TILE_T >= 5
    TILE_CASE(5)
#endif
#if TILE_T >= 6
    TILE_CASE(6)
#endif
    default: return;
    }
#undef TILE_CASE
}
_Static_assert(TILE_T <= 6, "tile_pairs has a case per token count up to 6");

#ifdef DSV4_AVX512

/* ---- one token, weights decoded in registers ----
 * The tile path stores each decoded row and reads it back, which at one token costs as much as the dot itself.
 * Here 4 rows are decoded 32 columns at a time straight into the chunk step: VDPBF16PS in the avx512bf16 set, the
 * two fp32 FMAs of the emulation in the avx512 set (the token's halves split once per chunk for the 4 rows).
 * Same steps, same lanes, same tree: the tile path's bits. */
#ifdef PAIRS_DP
typedef __m512i x_chunk;
static inline x_chunk x_chunk_at(const uint16_t *x) { return _mm512_loadu_si512((const void *)x); }
static inline __m512 chunk_step(__m512 acc, __m512i w, x_chunk x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }
#else
typedef struct {
    __m512 odd, even;
} x_chunk;
static inline x_chunk x_chunk_at(const uint16_t *x) {
    const __m512i d = _mm512_loadu_si512((const void *)x);
    x_chunk c = { lane_odd(d), lane_even(d) };
    return c;
}
static inline __m512 chunk_step(__m512 acc, __m512i w, x_chunk x) {
    acc = _mm512_fmadd_ps(lane_odd(w), x.odd, acc);
    return _mm512_fmadd_ps(lane_even(w), x.even, acc);
}
#endif

enum { FUSED_ROWS = 4, FUSED_T = 6 };

/* The tokens of a fused call (one pass): n <= FUSED_T of them from the job's token t0, and the hull of their
 * exponent ranges (what pairs_safe must admit for every one of them). */
typedef struct {
    const uint16_t *x[FUSED_T];
    int t0, n;
    pairs_exp range;
    int log2_n32;
} fused_tokens;

/* Whether every one of n scale bytes lies in [lo, hi]. */
static int scales_within(const uint8_t *s, int n, int lo, int hi) {
    if (lo > hi || lo > 255 || hi < 0) return 0;
    const __m512i vlo = _mm512_set1_epi8((char)(lo < 0 ? 0 : lo)), vhi = _mm512_set1_epi8((char)(hi > 255 ? 255 : hi));
    for (int i = 0; i < n; i += 64) {
        const __mmask64 m = n - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
        const __m512i v = _mm512_maskz_loadu_epi8(m, s + i);
        if (_mm512_mask_cmplt_epu8_mask(m, v, vlo) | _mm512_mask_cmpgt_epu8_mask(m, v, vhi)) return 0;
    }
    return 1;
}

/* The scale bytes S a row may have for the fast decoders (FP8: 10..246, FP4: 2..252) and, with VDPBF16PS, for
 * pairs_safe against the tokens: its values lie in [2^(S-127+lo_add), 2^(S-127+hi_add)) (FP8: lo_add = -9,
 * hi_add = 8; FP4: -1, 2), so the row's range is at worst (min S + lo_add, max S + hi_add). */
static void scale_bounds(int fast_lo, int fast_hi, int lo_add, int hi_add, const fused_tokens *x, int *lo, int *hi) {
    *lo = fast_lo, *hi = fast_hi;
#ifdef PAIRS_DP
    *lo = imax(*lo, 142 - x->range.lo - lo_add);
    *hi = imin(*hi, 379 - x->log2_n32 - x->range.hi - hi_add);
#else
    (void)lo_add, (void)hi_add, (void)x;
#endif
}

/* acc[r][t] for NT tokens after one chunk of row r's decoded bf16s wv[r] (decoded once, used NT times). */
static ALWAYS_INLINE void chunk_steps(__m512 acc[FUSED_ROWS][FUSED_T], const __m512i wv[FUSED_ROWS],
                                      const fused_tokens *x, int k, const int NT) {
    for (int t = 0; t < NT; t++) {
        const x_chunk xc = x_chunk_at(x->x[t] + k);
        for (int r = 0; r < FUSED_ROWS; r++) acc[r][t] = chunk_step(acc[r][t], wv[r], xc);
    }
}

static ALWAYS_INLINE void fused_out(__m512 acc[FUSED_ROWS][FUSED_T], float out[FUSED_ROWS][FUSED_T], const int NT) {
    _Static_assert(FUSED_ROWS == TILE_R && FUSED_T == TILE_T, "the fused rows' outputs are a tile's");
    tile_sums(acc, &out[0][0], NT);
}

/* ---- the rows of one group: FUSED_ROWS consecutive rows o0 .. o0 + 3 ----
 * Addressed from row o0 and the row stride (r * stride), not four data, four scale and four prefetch pointers:
 * with those live, GCC kept some pointers in vector registers and spilled others around the decode (1024 x 2048
 * on one core from L2, best of 5 alternated runs, GB/s, FP4 / FP8: 3 tokens 13.4 / 22.7 -> 16.5 / 25.9, 12 tokens
 * 4.3 / 7.5 -> 5.5 / 9.0). A thread's rows come in whole groups (linear.c and the MoE's 128-row units cut them
 * so); a group that is not whole (a weight whose rows are not a multiple of 4) takes the tile path, as does an FP8
 * group across two 128-row scale blocks (never, with row views at multiples of 4).
 * Few tokens read every weight byte about once: when AHEAD, each of the next group's rows is requested a line at
 * a time as the loop passes the same columns, so that its bytes arrive while these rows are used (requesting a
 * whole group at once measured slower: too many requests in flight; 8 or 12 rows ahead measured no faster). The
 * next group may lie past the call's range (the weight's next block of rows, which this thread usually takes
 * next: pool.h's dsv4_pool_run_blocks); a prefetch changes no value. */

/* FP8 rows (cols a multiple of 128, the four rows in one scale block: one block's constants serve them all): 0
 * when the block's scales leave the fast decoder's range or, with VDPBF16PS, pairs_safe refuses them (the caller
 * then takes the tile path). */
static ALWAYS_INLINE int fp8_rows_n(const dsv4_weight *w, int o0, const int AHEAD, const fused_tokens *x,
                                    float out[FUSED_ROWS][FUSED_T], const int NT) {
    const int n = w->cols;
    if (n % 128) return 0;
    const int64_t stride = n;
    const uint8_t *src = (const uint8_t *)w->data + (int64_t)o0 * stride;
    const uint8_t *srow = w->scale + (int64_t)((w->row0 + o0) / 128) * w->scale_cols;
    int slo, shi;
    scale_bounds(10, 246, -9, 8, x, &slo, &shi);
    if (!scales_within(srow, n / 128, slo, shi)) return 0;
    __m512 acc[FUSED_ROWS][FUSED_T];
    for (int r = 0; r < FUSED_ROWS; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 128) {
        const fp8_block_consts c = fp8_block(srow[i / 128]);
        if (AHEAD)
            for (int r = FUSED_ROWS; r < 2 * FUSED_ROWS; r++)
                __builtin_prefetch(src + r * stride + i, 0, 3), __builtin_prefetch(src + r * stride + i + 64, 0, 3);
        for (int k = i; k < i + 128; k += 32) {
            __m512i wv[FUSED_ROWS];
            for (int r = 0; r < FUSED_ROWS; r++) wv[r] = fp8_bf16x32(src + r * stride + k, c);
            chunk_steps(acc, wv, x, k, NT);
        }
    }
    fused_out(acc, out, NT);
    return 1;
}

/* FP4 rows (cols a multiple of 32): 0 as fp8_rows_n. PLANES: the rows in nibble planes (WF_FP4P, model/fp4_planes.h;
 * cols a multiple of 128): each row's 128 columns one 64-byte load whose four chunks fp4p_bf16x32 decodes, the same
 * bf16s into the same steps, so the same bits. */
static ALWAYS_INLINE int fp4_rows_n(const dsv4_weight *w, int o0, const int AHEAD, const fused_tokens *x,
                                    float out[FUSED_ROWS][FUSED_T], const int NT, const int PLANES) {
    const int n = w->cols;
    if (PLANES && n % 128) return 0;
    const int64_t stride = n / 2, sstride = w->scale_cols;
    const uint8_t *src = (const uint8_t *)w->data + (int64_t)o0 * stride;
    const uint8_t *srow = w->scale + (int64_t)(w->row0 + o0) * sstride;
    int slo, shi;
    scale_bounds(2, 252, -1, 2, x, &slo, &shi);
    for (int r = 0; r < FUSED_ROWS; r++)
        if (!scales_within(srow + r * sstride, n / 32, slo, shi)) return 0;
    __m512 acc[FUSED_ROWS][FUSED_T];
    for (int r = 0; r < FUSED_ROWS; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    /* 128 columns (four scale blocks) at a time: each row's four scale bytes in one word, read once per chunk,
     * not once per block */
    for (int i = 0; i < n; i += 128) {
        const int nb = PLANES || n - i >= 128 ? 4 : (n - i) / 32;   /* PLANES: 4, known here (the chunks' shifts immediates) */
        uint32_t sw[FUSED_ROWS];
        for (int r = 0; r < FUSED_ROWS; r++) {
            if (AHEAD) __builtin_prefetch(src + (FUSED_ROWS + r) * stride + i / 2, 0, 3);
            sw[r] = 0;
            if (nb == 4) memcpy(&sw[r], srow + r * sstride + i / 32, 4);
            else
                for (int j = 0; j < nb; j++) sw[r] |= (uint32_t)srow[r * sstride + i / 32 + j] << (8 * j);
        }
        __m512i words[FUSED_ROWS];   /* planes: each row's words held across its four chunks */
        for (int r = 0; r < FUSED_ROWS && PLANES; r++) words[r] = _mm512_loadu_si512((const void *)(src + r * stride + i / 2));
        for (int j = 0; j < nb; j++) {
            __m512i wv[FUSED_ROWS];
            for (int r = 0; r < FUSED_ROWS; r++) {
                const __m512i table = fp4_table((sw[r] >> (8 * j)) & 0xff);
                wv[r] = PLANES ? fp4p_bf16x32(words[r], j, table) : fp4_bf16x32(src + r * stride + (i + 32 * j) / 2, table);
            }
            chunk_steps(acc, wv, x, i + 32 * j, NT);
        }
    }
    fused_out(acc, out, NT);
    return 1;
}

/* BF16 rows (cols a multiple of 32). With VDPBF16PS the rows' exponent ranges are only known at the end, so
 * they are gathered on the way and a row pairs_safe refuses returns 0 (the caller redoes the rows). */
static ALWAYS_INLINE int bf16_rows_n(const dsv4_weight *w, int o0, const int AHEAD, const fused_tokens *x,
                                     float out[FUSED_ROWS][FUSED_T], const int NT) {
    const int n = w->cols;
    if (n % 32) return 0;
    /* here a pointer per row, and the loop's own: measured from memory, the stride form ran ~7 % slower (one
     * token, 2048 x 4096, one thread: 18-20 GB/s against 20-22) though faster from L2 */
    const uint16_t *src[FUSED_ROWS];
    const char *ahead[FUSED_ROWS];
    __m512 acc[FUSED_ROWS][FUSED_T];
    for (int r = 0; r < FUSED_ROWS; r++) {
        src[r] = (const uint16_t *)w->data + (int64_t)(o0 + r) * n;
        ahead[r] = AHEAD ? (const char *)(src[r] + (int64_t)FUSED_ROWS * n) : NULL;
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    }
#ifdef PAIRS_DP
    const __m512i mag_mask = _mm512_set1_epi16(0x7fff);
    __m512i vlo[FUSED_ROWS], vhi[FUSED_ROWS];
    for (int r = 0; r < FUSED_ROWS; r++) vlo[r] = mag_mask, vhi[r] = _mm512_setzero_si512();
#endif
    for (int i = 0; i < n; i += 32) {
        __m512i wv[FUSED_ROWS];
        for (int r = 0; r < FUSED_ROWS; r++) {
            if (ahead[r]) __builtin_prefetch(ahead[r] + 2 * i, 0, 3);
            wv[r] = _mm512_loadu_si512((const void *)(src[r] + i));
#ifdef PAIRS_DP
            const __m512i m = _mm512_and_si512(wv[r], mag_mask);
            vlo[r] = _mm512_mask_min_epu16(vlo[r], _mm512_test_epi16_mask(m, m), vlo[r], m);
            vhi[r] = _mm512_max_epu16(vhi[r], m);
#endif
        }
        chunk_steps(acc, wv, x, i, NT);
    }
#ifdef PAIRS_DP
    for (int r = 0; r < FUSED_ROWS; r++) {
        uint16_t l[32], h[32];
        _mm512_storeu_si512((void *)l, vlo[r]);
        _mm512_storeu_si512((void *)h, vhi[r]);
        unsigned lo = 0x7fff, hi = 0;
        for (int k = 0; k < 32; k++) lo = l[k] < lo ? l[k] : lo, hi = h[k] > hi ? h[k] : hi;
        if (!pairs_safe(range_of_mags(lo, hi), x->range, x->log2_n32)) return 0;
    }
#endif
    fused_out(acc, out, NT);
    return 1;
}

static ALWAYS_INLINE int rows_n(const dsv4_weight *w, int o0, const int AHEAD, const fused_tokens *x,
                                float out[FUSED_ROWS][FUSED_T], const int NT) {
    switch (w->fmt) {
    case WF_FP8: return fp8_rows_n(w, o0, AHEAD, x, out, NT);
    case WF_FP4: return fp4_rows_n(w, o0, AHEAD, x, out, NT, 0);
    case WF_FP4P: return fp4_rows_n(w, o0, AHEAD, x, out, NT, 1);
    case WF_BF16: return bf16_rows_n(w, o0, AHEAD, x, out, NT);
    default: return 0;
    }
}

/* Whether rows o0 .. o0 + 3 are a group the fused kernels take: all in the call, and for FP8 in one scale block. */
static int group_whole(const dsv4_weight *w, int o0, int end) {
    if (o0 + FUSED_ROWS > end) return 0;
    return w->fmt != WF_FP8 || (w->row0 + o0) / 128 == (w->row0 + o0 + FUSED_ROWS - 1) / 128;
}

/* The group o0 .. o0 + 3 against the x->n tokens of pass x; 0 when the caller must take the tile path. ahead:
 * request the next group's rows (only the first pass: a later one finds its rows in cache). */
static int rows_fused(const dsv4_weight *w, int o0, int ahead, const fused_tokens *x, float out[FUSED_ROWS][FUSED_T]) {
#define FUSED_CASE(NT) \
    case NT: return ahead ? rows_n(w, o0, 1, x, out, NT) : rows_n(w, o0, 0, x, out, NT);
    switch (x->n) {
    FUSED_CASE(1)
    FUSED_CASE(2)
    FUSED_CASE(3)
    FUSED_CASE(4)
    FUSED_CASE(5)
    FUSED_CASE(6)
    default: return 0;
    }
#undef FUSED_CASE
}
_Static_assert(FUSED_T == 6, "rows_fused has a case per token count up to 6");
#endif

static inline float *out_at(const cpu_pairs_job *j, int t, int o) {
    return j->y_rows ? j->y_rows[t] + o : j->y + (int64_t)t * j->ldy + o;
}

/* A tile's outputs (out[r * ld + t], nr rows from o0, nt tokens from t0) into y: token by token, its rows
 * contiguous there. (Row by row, GCC vectorised the stores over the tokens into scatters, which on Zen 5 took a
 * quarter of a 128-token linear's time.) */
static inline void store_tile(const cpu_pairs_job *j, int t0, int nt, int o0, int nr, const float *out, int ld) {
    for (int t = 0; t < nt; t++) {
        float *yt = out_at(j, t0 + t, o0);
        for (int r = 0; r < nr; r++) yt[r] = out[r * ld + t];
    }
}

#if defined(DSV4_AVX2) && !defined(DSV4_AVX512)
/* ---- AVX2: the steps on split fp32 layouts ----
 * With 16 ymm registers and no 16-bit permutes, splitting bf16 pairs inside the tile (an AND or a shift per load)
 * doubled the non-FMA work of the fp32 tile. So here both operands are laid out once, per 16 columns (one 8-lane
 * group of a chunk): [the 8 even columns | the 8 odd columns], as fp32. A row is decoded by the fp32 decoders
 * (exact values) and truncated to its bf16 (the value itself for every real scale; weight_row_bf16's bits
 * otherwise); a token comes from its bf16s. The tile then only loads and runs each lane's two FMAs: odd, even. */
static void split_row(const float *v, int n32, float *out) {
    const __m256 hi16 = _mm256_castsi256_ps(_mm256_set1_epi32((int)0xffff0000u));
    for (int i = 0; i < n32; i += 16) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(v + i), hi16), b = _mm256_and_ps(_mm256_loadu_ps(v + i + 8), hi16);
        /* shuffle_ps works within 128-bit halves: [a0 a2 b0 b2 | a4 a6 b4 b6], then the 64-bit pieces reordered */
        const __m256 ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
        const __m256 od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
        _mm256_storeu_ps(out + i, ev);
        _mm256_storeu_ps(out + i + 8, od);
    }
}

static void split_token(const uint16_t *xb, int n32, float *out) {
    for (int i = 0; i < n32; i += 16) {
        const __m256i d = _mm256_loadu_si256((const __m256i *)(xb + i));
        _mm256_storeu_ps(out + i, lane_even(d));
        _mm256_storeu_ps(out + i + 8, lane_odd(d));
    }
}

/* Row `row` decoded, truncated and split into out[0..n32) (ftmp: n32 floats). */
static void split_weight_row(const dsv4_weight *w, int row, int n32, float *ftmp, float *out) {
    ISA_FN(weight_decode_row)(w, row, ftmp);
    memset(ftmp + w->cols, 0, sizeof(float) * (size_t)(n32 - w->cols));
    split_row(ftmp, n32, out);
}

static ALWAYS_INLINE void tile_split_n(const float *const w[TILE_R], const float *const x[TILE_T], int n32, float *out,
                                       const int NT) {
    enum { KBLOCK = 512 };
    __m256 part[TILE_R][TILE_T][2];
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++) part[r][t][0] = part[r][t][1] = _mm256_setzero_ps();
    for (int k0 = 0; k0 < n32; k0 += KBLOCK) {
        const int k1 = imin(n32, k0 + KBLOCK);
        for (int g = 0; g < 2; g++) {
            __m256 acc[TILE_R][TILE_T];
            for (int r = 0; r < TILE_R; r++)
                for (int t = 0; t < NT; t++) acc[r][t] = part[r][t][g];
            for (int c = k0 + 16 * g; c < k1; c += 32) {
                for (int half = 8; half >= 0; half -= 8) {   /* odd columns (second half of the block), then even */
                    __m256 wv[TILE_R];
                    for (int r = 0; r < TILE_R; r++) wv[r] = _mm256_loadu_ps(w[r] + c + half);
                    for (int t = 0; t < NT; t++) {
                        const __m256 xv = _mm256_loadu_ps(x[t] + c + half);
                        for (int r = 0; r < TILE_R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
                    }
                }
            }
            for (int r = 0; r < TILE_R; r++)
                for (int t = 0; t < NT; t++) part[r][t][g] = acc[r][t];
        }
    }
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < NT; t++) {
            float L[16];
            _mm256_storeu_ps(L, part[r][t][0]);
            _mm256_storeu_ps(L + 8, part[r][t][1]);
            out[r * TILE_T + t] = reduce16(L);
        }
}

static void tile_split(const float *const w[TILE_R], const float *const x[TILE_T], int n32, int nt, float *out) {
    switch (nt) {
    case 1: tile_split_n(w, x, n32, out, 1); return;
    case 2: tile_split_n(w, x, n32, out, 2); return;
    case 3: tile_split_n(w, x, n32, out, 3); return;
    default: tile_split_n(w, x, n32, out, 4); return;
    }
}
_Static_assert(TILE_T == 4, "tile_split has a case per token count up to 4");

/* One token: NR decoded rows split in registers, straight into the two 8-lane groups' steps (the rows are not
 * stored split and read back); several rows at once so that the FMA chains overlap. */
enum { SPLIT_ROWS = 3 };
_Static_assert(SPLIT_ROWS <= TILE_R, "the one-token rows fit the tile's row buffers");
static void dot_split_rows(const float *const v[SPLIT_ROWS], const float *xs, int n32, float out[SPLIT_ROWS]) {
    const __m256 hi16 = _mm256_castsi256_ps(_mm256_set1_epi32((int)0xffff0000u));
    __m256 acc[SPLIT_ROWS][2];
    for (int r = 0; r < SPLIT_ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int c = 0; c < n32; c += 32)
        for (int g = 0; g < 2; g++) {
            const int i = c + 16 * g;
            const __m256 xo = _mm256_loadu_ps(xs + i + 8), xe = _mm256_loadu_ps(xs + i);
            for (int r = 0; r < SPLIT_ROWS; r++) {
                const __m256 a = _mm256_and_ps(_mm256_loadu_ps(v[r] + i), hi16), b = _mm256_and_ps(_mm256_loadu_ps(v[r] + i + 8), hi16);
                const __m256 ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
                const __m256 od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
                acc[r][g] = _mm256_fmadd_ps(od, xo, acc[r][g]);
                acc[r][g] = _mm256_fmadd_ps(ev, xe, acc[r][g]);
            }
        }
    for (int r = 0; r < SPLIT_ROWS; r++) {
        float L[16];
        _mm256_storeu_ps(L, acc[r][0]);
        _mm256_storeu_ps(L + 8, acc[r][1]);
        out[r] = reduce16(L);
    }
}

/* pairs_rows on AVX2: every token split once per call on this thread (a fraction 1 / its rows of the work), then
 * TILE_R rows decoded and split at a time, every token tile. */
static void pairs_rows_split(const cpu_pairs_job *j, int begin, int end) {
    const cpu_pairs_tokens *b = j->b;
    const dsv4_weight *w = j->w;
    const int n32 = b->n32;
    float *xs = malloc(sizeof(float) * (size_t)b->T * n32), *ws = malloc(sizeof(float) * (size_t)(TILE_R + 1) * n32);
    if (!xs || !ws) goto done;   /* cannot happen for real configs; leaves y untouched rather than crash */
    float *ftmp = ws + (size_t)TILE_R * n32;
    for (int t = 0; t < b->T; t++) split_token(b->xb + (size_t)t * n32, n32, xs + (size_t)t * n32);
    const size_t row_bytes = weight_cols_bytes(w, w->cols);
    if (b->T == 1) {   /* one token: each row decoded, then dotted with the split done in registers */
        for (int o0 = begin; o0 < end; o0 += SPLIT_ROWS) {
            const int nr = imin(SPLIT_ROWS, end - o0);
            if (o0 + SPLIT_ROWS < end)
                prefetch_bytes((const char *)w->data + (size_t)(o0 + SPLIT_ROWS) * row_bytes, row_bytes * (size_t)imin(SPLIT_ROWS, end - o0 - SPLIT_ROWS));
            const float *v[SPLIT_ROWS];
            for (int r = 0; r < SPLIT_ROWS; r++) {
                if (r >= nr) { v[r] = v[r - 1]; continue; }   /* a partial group repeats its last row */
                float *d = ws + (size_t)r * n32;
                ISA_FN(weight_decode_row)(w, o0 + r, d);
                memset(d + w->cols, 0, sizeof(float) * (size_t)(n32 - w->cols));
                v[r] = d;
            }
            float out[SPLIT_ROWS];
            dot_split_rows(v, xs, n32, out);
            for (int r = 0; r < nr; r++) *out_at(j, 0, o0 + r) = out[r];
        }
        goto done;
    }
    for (int o0 = begin; o0 < end; o0 += TILE_R) {
        const int nr = imin(TILE_R, end - o0);
        const float *wr[TILE_R];
        for (int r = 0; r < TILE_R; r++) {
            if (r >= nr) { wr[r] = wr[r - 1]; continue; }
            split_weight_row(w, o0 + r, n32, ftmp, ws + (size_t)r * n32);
            wr[r] = ws + (size_t)r * n32;
        }
        if (b->T <= 2 && o0 + TILE_R < end)
            prefetch_bytes((const char *)w->data + (size_t)(o0 + TILE_R) * row_bytes, row_bytes * (size_t)imin(TILE_R, end - o0 - TILE_R));
        for (int t0 = 0; t0 < b->T; t0 += TILE_T) {
            const int nt = imin(TILE_T, b->T - t0);
            const float *xt[TILE_T];
            for (int t = 0; t < TILE_T; t++) xt[t] = xs + (size_t)(t0 + imin(t, nt - 1)) * n32;
            float out[TILE_R * TILE_T];
            tile_split(wr, xt, n32, nt, out);
            store_tile(j, t0, nt, o0, nr, out, TILE_T);
        }
    }
done:
    free(xs);
    free(ws);
}
#endif

#ifdef DSV4_AVX512
/* Passes of the fused path over a row group (pairs_rows): up to fused_max_tokens(w) tokens decode rows in registers,
 * in as few passes of at most FUSED_T tokens as hold them, each of ceil(tokens / passes) but the last (12 tokens: 6 +
 * 6; 9: 5 + 4; 16: 6 + 6 + 4); more take the tile. Each later pass decodes the group's bytes again, from cache, which
 * costs less than decoding them once into the tile's buffer and running the tile while the tokens stay at most 16 for
 * FP8 and FP4 (the tile's 6-token groups then read the tokens from L2). Times on a Zen 5 core, one linear
 * (tools/bench/linear_bench 1 T), tile -> fused (4-token passes): 2048 x 4096 at 6 tokens FP8 1.14-1.48 -> 0.72-0.74
 * ms; at 12 / 16 tokens FP8 5.4-5.6 / 4.6-4.9 -> 7.0-7.4 / 5.5-5.7 GB/s, FP4 3.4-3.5 / 3.0-3.1 -> 4.6-4.7 / 3.7-3.8
 * GB/s; 8192 x 1024 at 16 FP8 3.2-3.5 -> 5.0-5.2; 24 tokens gained 0-15 %, 32 lost 5-15 %. BF16 rows need no decoding
 * and the tile's larger register block wins from 9 tokens on (16: 8.2-8.8 -> 7.8-8.3). Passes of 6 tokens instead of 4
 * (24 accumulators; a routed expert of a 128-token prompt sees ~12 tokens: two decodes of its rows, not three), min of
 * 5 alternated runs, µs a matrix, FP8 / FP4: 1024 x 2048 at 6 tokens 199 / 146 -> 162 / 119, 12 tokens 338 / 278 ->
 * 345 / 249; 2048 x 1024 at 10 tokens 352 / 261 -> 317 / 211, 14 tokens 473 / 346 -> 430 / 315, 8 tokens (two passes
 * of 4 either way) 246 / 184 -> 228 / 177.
 */
enum { FUSED_MAX_T = 16, FUSED_PASSES = (FUSED_MAX_T + FUSED_T - 1) / FUSED_T };
static inline int fused_max_tokens(const dsv4_weight *w) { return w->fmt == WF_BF16 ? 8 : FUSED_MAX_T; }

/* Row o against every token of the job by the tile, its decoded bf16s in rows (n32 of them) and ftmp the slow
 * decoder's scratch: the fused path's fallback for a row whose scales leave the fast decoders' range or whose
 * products VDPBF16PS cannot be trusted with (pairs_safe). The tile path's bits, as the fused path's. */
static void tile_one_row(const cpu_pairs_job *j, int o, uint16_t *rows, float *ftmp) {
    const cpu_pairs_tokens *b = j->b;
    const int n32 = b->n32;
    const pairs_exp wexp = ISA_FN(weight_row_bf16)(j->w, o, 0, n32, rows, ftmp);
    const uint16_t *wr[TILE_R];
    for (int k = 0; k < TILE_R; k++) wr[k] = rows;
    for (int t0 = 0; t0 < b->T; t0 += TILE_T) {
        const int nt = imin(TILE_T, b->T - t0);
        int dp = 0;
#ifdef PAIRS_DP
        dp = 1;
        for (int t = t0; t < t0 + nt; t++) dp &= pairs_safe(wexp, b->range[t], b->log2_n32);
#else
        (void)wexp;
#endif
        const uint16_t *xs[TILE_T];
        for (int t = 0; t < TILE_T; t++) xs[t] = b->xb + (size_t)(t0 + imin(t, nt - 1)) * n32;
        float tile_out[TILE_R * TILE_T];
        tile_pairs(wr, xs, n32, nt, dp, tile_out);
        for (int t = 0; t < nt; t++) *out_at(j, t0 + t, o) = tile_out[t];
    }
}
#endif

/* Rows of the tile path's block (pairs_rows): as many decoded bf16 rows as its row buffer holds (TILE_R rows of
 * buf_cols columns), at most PAIRS_BLOCK_MAX, a multiple of TILE_R no larger than the thread's rows, at least TILE_R. */
enum { PAIRS_BLOCK_MAX = 64 };
static int pairs_block_rows(int n32, int buf_cols, int begin, int end) {
    int rb = TILE_R * buf_cols / n32 / TILE_R * TILE_R;
    const int mine = (end - begin + TILE_R - 1) / TILE_R * TILE_R;
    if (rb > PAIRS_BLOCK_MAX) rb = PAIRS_BLOCK_MAX;
    if (rb > mine) rb = mine;
    return rb < TILE_R ? TILE_R : rb;
}

/* Rows [begin, end) of a cpu_pairs_job: few tokens by the fused rows (AVX-512), else blocks of rows decoded to
 * bf16, then every token tile. */
void ISA_FN(pairs_rows)(void *ctx, int begin, int end, int thread) {
    (void)thread;
    const cpu_pairs_job *j = ctx;
    const cpu_pairs_tokens *b = j->b;
    const dsv4_weight *w = j->w;
    const int n32 = b->n32, cols = w->cols;
#if defined(DSV4_AVX2) && !defined(DSV4_AVX512)
    if (n32 <= 65536) {   /* (every real shape; larger ones take the generic steps below) */
        pairs_rows_split(j, begin, end);
        return;
    }
#endif
    /* TILE_R bf16 rows and one fp32 row for the slow decoder: 4 x 16 KiB + 32 KiB on the stack up to 8192
     * columns (every real shape) */
    enum { STACK_COLS = 8192 };
    uint16_t rows_stack[TILE_R * STACK_COLS];
    float ftmp_stack[STACK_COLS];
    uint16_t *rows = n32 <= STACK_COLS ? rows_stack : malloc(sizeof(uint16_t) * (size_t)TILE_R * n32);
    float *ftmp = cols <= STACK_COLS ? ftmp_stack : malloc(sizeof(float) * (size_t)cols);
    if (!rows || !ftmp) goto done;   /* cannot happen for real configs; leaves y untouched rather than crash */
    const size_t row_bytes = weight_cols_bytes(w, cols);
#ifdef DSV4_AVX512
    if (b->T <= fused_max_tokens(w)) {   /* few tokens: rows decoded in registers, FUSED_ROWS at a time */
        const int passes = (b->T + FUSED_T - 1) / FUSED_T, per = (b->T + passes - 1) / passes;
        fused_tokens x[FUSED_PASSES];
        for (int p = 0; p < passes; p++) {
            x[p].range = (pairs_exp){ 255, 0 };
            x[p].log2_n32 = b->log2_n32;
            x[p].t0 = p * per, x[p].n = imin(per, b->T - p * per);
            for (int t = x[p].t0; t < x[p].t0 + x[p].n; t++) {
                x[p].x[t - x[p].t0] = b->xb + (size_t)t * n32;
                x[p].range.lo = imin(x[p].range.lo, b->range[t].lo), x[p].range.hi = imax(x[p].range.hi, b->range[t].hi);
            }
        }
        for (int o0 = begin; o0 < end; o0 += FUSED_ROWS) {
            const int nr = imin(FUSED_ROWS, end - o0);
            float out[FUSED_PASSES][FUSED_ROWS][FUSED_T];
            int fused = group_whole(w, o0, end);
            for (int p = 0; p < passes && fused; p++)
                fused = rows_fused(w, o0, !p && o0 + 2 * FUSED_ROWS <= w->rows, &x[p], out[p]);
            if (fused) {
                for (int p = 0; p < passes; p++)
                    store_tile(j, x[p].t0, x[p].n, o0, nr, &out[p][0][0], FUSED_T);
                continue;
            }
            for (int r = 0; r < nr; r++)   /* the tile path, one row at a time (not a whole group, scales out of range, or unsafe) */
                tile_one_row(j, o0 + r, rows, ftmp);
        }
        goto done;
    }
#endif
    /* Many tokens: a block of rows is decoded first (into the row buffer: 64 KiB, 16 rows of 2048 columns), then
     * each tile of TILE_T tokens meets every TILE_R-row group of the block while its tokens stay in L1 (the block's
     * rows come from L2). Before, one row group met all the tokens, then the next: every token tile came from L2
     * again for each 4 rows (with the tree and the stores below, ~35-40 % of VDPBF16PS's peak at 128 tokens on a
     * Zen 5 core). Who computes what only: every output is one tile_pairs chain. */
    const int rb = pairs_block_rows(n32, rows == rows_stack ? STACK_COLS : n32, begin, end);
    /* BF16 rows of whole chunks are the tile's operands as they lie: read in place, only their ranges taken (a
     * copy into the row buffer was ~3 % of a 16-stream flash-2g step: the head and wo_a are BF16) */
    const int in_place = w->fmt == WF_BF16 && n32 == cols;
    for (int b0 = begin; b0 < end; b0 += rb) {
        const int nb = imin(rb, end - b0);
        pairs_exp wexp[PAIRS_BLOCK_MAX];
        const uint16_t *wrow[PAIRS_BLOCK_MAX];
        for (int r = 0; r < nb; r++) {
            if (in_place) {
                wrow[r] = (const uint16_t *)w->data + (size_t)(b0 + r) * cols;
                wexp[r] = bf16_range(wrow[r], cols);
            } else {
                wrow[r] = rows + (size_t)r * n32;
                wexp[r] = ISA_FN(weight_row_bf16)(w, b0 + r, 0, n32, rows + (size_t)r * n32, ftmp);
            }
        }
        /* few tokens: the weights are a stream from memory; ask for the next block's rows while these are used */
        if (b->T <= 2 && b0 + nb < end)
            prefetch_bytes((const char *)w->data + (size_t)(b0 + nb) * row_bytes, row_bytes * (size_t)imin(nb, end - b0 - nb));
        for (int t0 = 0; t0 < b->T; t0 += TILE_T) {
            const int nt = imin(TILE_T, b->T - t0);
            const uint16_t *xs[TILE_T];
            for (int t = 0; t < TILE_T; t++) xs[t] = b->xb + (size_t)(t0 + imin(t, nt - 1)) * n32;
            for (int g0 = 0; g0 < nb; g0 += TILE_R) {
                const int nr = imin(TILE_R, nb - g0);
                const uint16_t *wr[TILE_R];
                for (int r = 0; r < TILE_R; r++) wr[r] = wrow[g0 + imin(r, nr - 1)];   /* a partial tile repeats its last row */
                int dp = 0;
#ifdef PAIRS_DP
                dp = 1;
                for (int t = 0; t < nt; t++)
                    for (int r = 0; r < nr; r++) dp &= pairs_safe(wexp[g0 + r], b->range[t0 + t], b->log2_n32);
#else
                (void)wexp;
#endif
                float out[TILE_R * TILE_T];
                tile_pairs(wr, xs, n32, nt, dp, out);
                store_tile(j, t0, nt, b0 + g0, nr, out, TILE_T);
            }
        }
    }
done:
    if (rows != rows_stack) free(rows);
    if (ftmp != ftmp_stack) free(ftmp);
}

#ifdef PAIRS_DP
/* Whether VDPBF16PS computes pairs.h's two steps on this CPU: random normal operands with exponents +-20 and
 * random accumulators, 4096 lanes, compared bit for bit with the fp32 steps. The candidates it tells apart
 * (even column first, or one rounding of both products, as some dot-product units do) differ from the steps on
 * about 1 lane in 120 of such cases (measured), so each would fail here dozens of times. */
int ISA_FN(pairs_selftest)(void) {
    uint32_t s = 0x9e3779b9u;
    for (int it = 0; it < 256; it++) {
        uint16_t a[32], c[32];
        float acc[16], got[16];
        for (int i = 0; i < 64; i++) {
            s ^= s << 13, s ^= s >> 17, s ^= s << 5;
            const uint16_t v = (uint16_t)(((s >> 31) << 15) | ((107 + (s >> 8) % 41) << 7) | (s & 0x7f));
            if (i < 32) a[i] = v; else c[i - 32] = v;
        }
        for (int j = 0; j < 16; j++) {
            s ^= s << 13, s ^= s >> 17, s ^= s << 5;
            acc[j] = it % 4 == 0 ? 0.0f : bf16_to_f32(a[j]) * (float)(s % 4096);
        }
        _mm512_storeu_ps(got, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512((const void *)a),
                                               (__m512bh)_mm512_loadu_si512((const void *)c)));
        for (int j = 0; j < 16; j++) {
            float want = fmaf(bf16_to_f32(a[2 * j + 1]), bf16_to_f32(c[2 * j + 1]), acc[j]);
            want = fmaf(bf16_to_f32(a[2 * j]), bf16_to_f32(c[2 * j]), want);
            if (memcmp(&want, &got[j], sizeof want)) return 0;
        }
    }
    return 1;
}
#endif
