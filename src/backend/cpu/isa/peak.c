/* The arithmetic ceiling of this instruction set's linears (isa.h peak_flops): what `dsv4 bench` holds the
 * linears' work against, as it holds their bytes against the measured read bandwidth.
 *
 * PEAK_CHAINS independent accumulators, each one multiply-add instruction a round, so that no instruction waits
 * for its own previous result (Zen 5 and Sapphire Rapids keep ~8-10 such instructions in flight: 2 pipes x 4-5
 * cycles of latency). Operands stay in registers: no load or store in the loop. The instruction is the one the
 * set's linears spend their arithmetic in: VDPBF16PS (16 lanes x 2 products and 2 adds = 64 flops) for the pair
 * order on the avx512bf16 set, else the widest fp32 FMA the set has (avx512 32 flops, avx2 16), and the scalar
 * set's separate multiply and add (2 flops; -ffp-contract=off). The values stay normal and finite for any
 * `steps` a benchmark runs (each round adds less than 2^-16 to a lane). */
#include "backend/cpu/isa.h"
#include "backend/cpu/vec.h"

enum { PEAK_CHAINS = 12 };

double ISA_FN(peak_flops)(int bf16, long steps, float *sink) {
#if defined(DSV4_AVX512) && defined(__AVX512BF16__)
    if (bf16) {
        const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3b80);   /* 2^-8 in both bf16 halves of every lane */
        __m512 acc[PEAK_CHAINS];
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
        for (long s = 0; s < steps; s++)
            for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, a);
        __m512 t = acc[0];
        for (int c = 1; c < PEAK_CHAINS; c++) t = _mm512_add_ps(t, acc[c]);
        *sink += _mm512_reduce_add_ps(t);
        return 64.0 * PEAK_CHAINS * (double)steps;
    }
#endif
    (void)bf16;
    volatile float one_v = 1.0f;   /* not a constant: a multiply by a known 1 could be folded into an add */
    const float one = one_v;
#if defined(DSV4_AVX512)
    const __m512 m = _mm512_set1_ps(one), a = _mm512_set1_ps(0x1p-20f);
    __m512 acc[PEAK_CHAINS];
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (long s = 0; s < steps; s++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    __m512 t = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) t = _mm512_add_ps(t, acc[c]);
    *sink += _mm512_reduce_add_ps(t);
    return 32.0 * PEAK_CHAINS * (double)steps;
#elif defined(DSV4_AVX2)
    const __m256 m = _mm256_set1_ps(one), a = _mm256_set1_ps(0x1p-20f);
    __m256 acc[PEAK_CHAINS];
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm256_set1_ps((float)c);
    for (long s = 0; s < steps; s++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
    float lanes[8];
    __m256 t = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) t = _mm256_add_ps(t, acc[c]);
    _mm256_storeu_ps(lanes, t);
    for (int i = 0; i < 8; i++) *sink += lanes[i];
    return 16.0 * PEAK_CHAINS * (double)steps;
#else
    const float m = one, a = 0x1p-20f;
    float acc[PEAK_CHAINS];
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = (float)c;
    for (long s = 0; s < steps; s++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = acc[c] * m + a;
    for (int c = 0; c < PEAK_CHAINS; c++) *sink += acc[c];
    return 2.0 * PEAK_CHAINS * (double)steps;
#endif
}
