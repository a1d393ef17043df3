/* The arithmetic of token sampling, written once for the CPU sampler (core/sample.c) and the CUDA kernel
 * (backend/cuda/k_sample.cu), so that both draw the SAME token from the same logits bits.
 *
 * What makes the two agree bit for bit:
 *   - only correctly rounded operations (+ - * / and fma in float or double), each written out through the
 *     SM_* macros below: on the device the __*_rn intrinsics, which nvcc never contracts into FMAs; on the host
 *     plain operators in code that has no multiply feeding an add (so no compiler can contract anything; the
 *     Makefile also builds core/sample.c with -ffp-contract=off as a second guard);
 *   - exp and log are the polynomials below (Cephes-style, Horner with explicit fma), not libm / CUDA's;
 *   - the noise is counter-based: u(seed, draw, id) is a hash, so token i's noise of draw d does not depend on
 *     which thread computes it or in which order;
 *   - every sum over a set of tokens (top-p) is the "lane tree sum" of SM_LANES lanes (sample.h states it),
 *     which the kernel computes with one thread per lane and the CPU with a loop over lanes.
 *
 * The race (the official generate.py's sampling): with w_i = exp((l_i - max l) / T) (unnormalised, so the top
 * token has w = 1 exactly) and E_i = -log(u_i) ~ Exp(1), the token drawn is argmax_i w_i / E_i, which is token i
 * with probability w_i / sum_j w_j. */
#ifndef DSV4_CORE_SAMPLE_MATH_H
#define DSV4_CORE_SAMPLE_MATH_H
#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define SM_FN static __host__ __device__ __forceinline__
#else
#define SM_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define SM_FMULF(a, b)    __fmul_rn((a), (b))
#define SM_FADDF(a, b)    __fadd_rn((a), (b))
#define SM_FSUBF(a, b)    __fsub_rn((a), (b))
#define SM_FDIVF(a, b)    __fdiv_rn((a), (b))
#define SM_FMAF(a, b, c)  __fmaf_rn((a), (b), (c))
#define SM_DMUL(a, b)     __dmul_rn((a), (b))
#define SM_DADD(a, b)     __dadd_rn((a), (b))
#define SM_DSUB(a, b)     __dsub_rn((a), (b))
#define SM_DDIV(a, b)     __ddiv_rn((a), (b))
#define SM_DFMA(a, b, c)  __fma_rn((a), (b), (c))
#else
#include <string.h>
#define SM_FMULF(a, b)    ((a) * (b))
#define SM_FADDF(a, b)    ((a) + (b))
#define SM_FSUBF(a, b)    ((a) - (b))
#define SM_FDIVF(a, b)    ((a) / (b))
#define SM_FMAF(a, b, c)  fmaf((a), (b), (c))
#define SM_DMUL(a, b)     ((a) * (b))
#define SM_DADD(a, b)     ((a) + (b))
#define SM_DSUB(a, b)     ((a) - (b))
#define SM_DDIV(a, b)     ((a) / (b))
#define SM_DFMA(a, b, c)  fma((a), (b), (c))
#endif

/* Lanes of the lane tree sum (sample.h) = the kernel's block size. Part of the definition of a draw. */
#define SM_LANES 1024
/* w below exp(-80) counts as 0: such a token has less than 1e-34 of the top token's probability. Keeping the
 * scale factor 2^k of exp normal (k >= -116) means no subnormal arithmetic anywhere. */
#define SM_EXP_MIN (-80.0f)
/* The bits of w = 1.0f: every w is in [0, 1], so its bits order like its value. */
#define SM_ONE_BITS 0x3f800000u

SM_FN uint32_t sm_f2u(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}
SM_FN float sm_u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}
SM_FN uint64_t sm_d2u(double x) {
#if defined(__CUDA_ARCH__)
    return (uint64_t)__double_as_longlong(x);
#else
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}
SM_FN double sm_u2d(uint64_t u) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)u);
#else
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* ---- the logit a token competes with ----------------------------------------------------------------------- */

/* NaN counts as -inf (never drawn unless every logit is -inf or NaN); ids at or above `limit` (when > 0) too. */
SM_FN float sm_logit(float l, int32_t id, int32_t limit) {
    if (l != l || (limit > 0 && id >= limit)) return -INFINITY;
    return l;
}

/* (a, ia) ranks before (b, ib): larger value, then lower id. A strict total order on distinct ids, so the
 * argmax over any set is the same whatever order a reduction visits it in. */
SM_FN int sm_before(double a, int32_t ia, double b, int32_t ib) { return a > b || (a == b && ia < ib); }

/* ---- exp on (-inf, 0] in float ----------------------------------------------------------------------------- */

/* exp(x) for x <= 0: 0 below SM_EXP_MIN (and for NaN); exp(0) = 1 exactly. k = rint(x log2 e), r = x - k ln2 in two
 * fma steps (Cody-Waite), Cephes' degree-5 polynomial for (exp(r) - 1 - r) / r^2, times 2^k built from bits. */
SM_FN float sm_expf(float x) {
    if (!(x >= SM_EXP_MIN)) return 0.0f;
    const float kf = rintf(SM_FMULF(x, 1.44269504088896341f));
    float r = SM_FMAF(-kf, 0.693359375f, x);
    r = SM_FMAF(-kf, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = SM_FMAF(p, r, 1.3981999507e-3f);
    p = SM_FMAF(p, r, 8.3334519073e-3f);
    p = SM_FMAF(p, r, 4.1665795894e-2f);
    p = SM_FMAF(p, r, 1.6666665459e-1f);
    p = SM_FMAF(p, r, 5.0000001201e-1f);
    const float y = SM_FADDF(SM_FMAF(p, SM_FMULF(r, r), r), 1.0f);
    const int k = (int)kf;   /* -116 .. 0 */
    return SM_FMULF(y, sm_u2f((uint32_t)(k + 127) << 23));
}

/* ---- log on (0, 1) in double ------------------------------------------------------------------------------- */

/* log(u) for a normal 0 < u < 1: u = m 2^e with m in [sqrt(1/2), sqrt(2)), s = (m-1)/(m+1),
 * log m = 2 atanh s = 2s + s z P(z) with z = s^2 and P(z) = sum_k 2/(2k+3) z^k (|z| < 0.0295: 11 terms reach
 * 1e-17), log u = e ln2_hi + (e ln2_lo + log m) (ln2_hi has 21 trailing zero bits: e ln2_hi is exact). */
SM_FN double sm_log_unit(double u) {
    const uint64_t b = sm_d2u(u);
    int e = (int)((b >> 52) & 0x7ff) - 1023;
    double m = sm_u2d((b & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);
    if (m > 1.4142135623730951) {
        m = SM_DMUL(m, 0.5);
        e += 1;
    }
    const double f = SM_DSUB(m, 1.0);   /* exact (Sterbenz) */
    const double s = SM_DDIV(f, SM_DADD(2.0, f));
    const double z = SM_DMUL(s, s);
    double P = 2.0 / 23.0;
    P = SM_DFMA(P, z, 2.0 / 21.0);
    P = SM_DFMA(P, z, 2.0 / 19.0);
    P = SM_DFMA(P, z, 2.0 / 17.0);
    P = SM_DFMA(P, z, 2.0 / 15.0);
    P = SM_DFMA(P, z, 2.0 / 13.0);
    P = SM_DFMA(P, z, 2.0 / 11.0);
    P = SM_DFMA(P, z, 2.0 / 9.0);
    P = SM_DFMA(P, z, 2.0 / 7.0);
    P = SM_DFMA(P, z, 2.0 / 5.0);
    P = SM_DFMA(P, z, 2.0 / 3.0);
    const double lm = SM_DFMA(s, SM_DMUL(z, P), SM_DMUL(2.0, s));
    const double ed = (double)e;
    return SM_DFMA(ed, 6.93147180369123816490e-01, SM_DFMA(ed, 1.90821492927058770002e-10, lm));
}

/* ---- counter-based noise ------------------------------------------------------------------------------------ */

#define SM_GOLDEN 0x9e3779b97f4a7c15ULL
/* splitmix64's output function (Steele, Lea, Flood 2014; the constants of Stafford's mix 13). */
SM_FN uint64_t sm_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
/* The key of draw number `draw` of the stream `seed` (computed once per draw): stream = splitmix64's first
 * output from state seed, then a second splitmix step keyed by the draw with another odd increment. */
SM_FN uint64_t sm_draw_key(uint64_t seed, uint64_t draw) {
    const uint64_t stream = sm_mix64(seed + SM_GOLDEN);
    return sm_mix64(stream + (draw + 1) * 0xd1b54a32d192ed03ULL);
}
/* Token id's 64 random bits in that draw: output id of splitmix64 started at state `key`. */
SM_FN uint64_t sm_token_bits(uint64_t key, int32_t id) { return sm_mix64(key + ((uint64_t)(uint32_t)id + 1) * SM_GOLDEN); }
/* u = (top 52 bits + 1/2) 2^-52, in [2^-53, 1 - 2^-53], exact; E = -log u ~ Exp(1), in (0, 37]. */
SM_FN double sm_uniform(uint64_t bits) { return SM_DMUL(SM_DADD((double)(bits >> 12), 0.5), 2.220446049250313080847e-16); }
SM_FN double sm_exp_noise(uint64_t key, int32_t id) { return -sm_log_unit(sm_uniform(sm_token_bits(key, id))); }
/* The race value of a kept token (w > 0): w / E, one correctly rounded division. */
SM_FN double sm_race(float w, uint64_t key, int32_t id) { return SM_DDIV((double)w, sm_exp_noise(key, id)); }

#endif
