/* The OFFICIAL activation roundings on many values at once: FP8 fake quantization of linear inputs and bf16
 * rounding. Each gives exactly the floats of its element-by-element definition in formats.c (tests/unit/
 * test_formats.c compares them on random, tie, subnormal and non-finite inputs); in OFFICIAL prefill the
 * scalar forms (a binary search per element) took half of the time.
 *
 * Why the FP8 shortcut is exact, for a block whose values are finite (others take the definition):
 *   - s = 2^e is a power of two with e in [-22, 121] (amax is floored at 1e-4), so x / s == x * 2^-e exactly
 *     rounded the same way, and min(|q|, 448) is the official clamp;
 *   - E4M3 round-to-nearest-even of |q|: at or above 2^-6 keep 3 mantissa bits of the fp32 pattern with the
 *     usual RNE carry (a carry into the exponent is the next binade, as the code order has it); below, the
 *     grid is 2^-9 (subnormals), rounded to nearest even by roundscale; both grids meet at 2^-6 = 8 * 2^-9;
 *   - the rounded value has at most 4 significant bits, so times s it is exact (or overflows identically)
 *     and bf16 rounding leaves it unchanged; the sign goes back on last (-0 stays -0).
 * Compiled once per instruction set (isa.h): the AVX-512 copy has the vector forms, the others the definitions. */
#include "backend/cpu/isa.h"
#include "backend/cpu/vec.h"
#include "model/formats.h"
#include <math.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#include <immintrin.h>
#define ACTQ_AVX512 1
#endif

#ifdef ACTQ_AVX512
static inline __m512 e4m3_round16(__m512 x, __m512 inv_s, __m512 s) {
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    const __m512 a = _mm512_min_ps(_mm512_abs_ps(_mm512_mul_ps(x, inv_s)), _mm512_set1_ps(448.0f));
    const __m512i u = _mm512_castps_si512(a);
    const __m512i bit = _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1));
    const __m512i rn = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7ffff)), bit),
                                        _mm512_set1_epi32((int)0xfff00000u));
    const __m512 sub = _mm512_roundscale_ps(a, (9 << 4) | _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
    const __m512 r = _mm512_mask_blend_ps(small, _mm512_castsi512_ps(rn), sub);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_mul_ps(r, s)), sign));
}
#endif

#ifdef ACTQ_AVX512
static inline float pow2f_exact(int e) {   /* 2^e for a normal result */
    const uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#endif

void ISA_FN(act_quant_fp8)(float *x, int n, int block) {
#ifdef ACTQ_AVX512
    for (int b0 = 0; b0 < n; b0 += block) {
        const int len = n - b0 < block ? n - b0 : block;
        float *xb = x + b0;
        if (len % 16) { act_quant_fp8_ref(xb, len, len); continue; }
        __m512 m = _mm512_set1_ps(1e-4f);
        __mmask16 nan = 0;
        for (int i = 0; i < len; i += 16) {
            const __m512 v = _mm512_loadu_ps(xb + i);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            m = _mm512_max_ps(m, _mm512_abs_ps(v));
        }
        const float amax = _mm512_reduce_max_ps(m);
        if (nan || !isfinite(amax)) { act_quant_fp8_ref(xb, len, len); continue; }
        uint32_t u;
        const float v = amax * (1.0f / 448.0f);
        memcpy(&u, &v, sizeof u);
        const int e = (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) != 0);   /* pow2_ceil's exponent */
        const __m512 s = _mm512_set1_ps(pow2f_exact(e)), inv_s = _mm512_set1_ps(pow2f_exact(-e));
        for (int i = 0; i < len; i += 16) _mm512_storeu_ps(xb + i, e4m3_round16(_mm512_loadu_ps(xb + i), inv_s, s));
    }
#else
    act_quant_fp8_ref(x, n, block);
#endif
}

/* bf16 round to nearest even on the bit pattern; NaN stays NaN with the quiet bit set (f32_to_bf16). */
void ISA_FN(round_bf16)(float *x, long n) {
    long i = 0;
#ifdef ACTQ_AVX512
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, vec_round_bf16_zmm(_mm512_loadu_ps(x + i)));
#endif
    round_bf16_ref(x + i, n - i);
}
