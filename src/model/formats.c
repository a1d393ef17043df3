#include "model/formats.h"
#include <math.h>
#include <string.h>

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }


float e4m3_to_f32(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = ldexpf((float)m / 8.0f, -6);
    else        v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

/* Every E4M3 byte decoded (generated from the formula above; checked against it by the unit test). */
const float dsv4_e4m3_table[256] = {
    0.0f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f, 0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f, 0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f, 0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f, 0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f, 0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f,
    1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f,
    2.0f, 2.25f, 2.5f, 2.75f, 3.0f, 3.25f, 3.5f, 3.75f,
    4.0f, 4.5f, 5.0f, 5.5f, 6.0f, 6.5f, 7.0f, 7.5f,
    8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f,
    16.0f, 18.0f, 20.0f, 22.0f, 24.0f, 26.0f, 28.0f, 30.0f,
    32.0f, 36.0f, 40.0f, 44.0f, 48.0f, 52.0f, 56.0f, 60.0f,
    64.0f, 72.0f, 80.0f, 88.0f, 96.0f, 104.0f, 112.0f, 120.0f,
    128.0f, 144.0f, 160.0f, 176.0f, 192.0f, 208.0f, 224.0f, 240.0f,
    256.0f, 288.0f, 320.0f, 352.0f, 384.0f, 416.0f, 448.0f, NAN,
    -0.0f, -0.001953125f, -0.00390625f, -0.005859375f, -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f, -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f, -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f, -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f, -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f, -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f, -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.0f, -1.125f, -1.25f, -1.375f, -1.5f, -1.625f, -1.75f, -1.875f,
    -2.0f, -2.25f, -2.5f, -2.75f, -3.0f, -3.25f, -3.5f, -3.75f,
    -4.0f, -4.5f, -5.0f, -5.5f, -6.0f, -6.5f, -7.0f, -7.5f,
    -8.0f, -9.0f, -10.0f, -11.0f, -12.0f, -13.0f, -14.0f, -15.0f,
    -16.0f, -18.0f, -20.0f, -22.0f, -24.0f, -26.0f, -28.0f, -30.0f,
    -32.0f, -36.0f, -40.0f, -44.0f, -48.0f, -52.0f, -56.0f, -60.0f,
    -64.0f, -72.0f, -80.0f, -88.0f, -96.0f, -104.0f, -112.0f, -120.0f,
    -128.0f, -144.0f, -160.0f, -176.0f, -192.0f, -208.0f, -224.0f, -240.0f,
    -256.0f, -288.0f, -320.0f, -352.0f, -384.0f, -416.0f, -448.0f, NAN,
};

uint8_t f32_to_e4m3(float x) {
    if (isnan(x)) return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7e;          /* saturate (official clamps before the cast) */
    /* Magnitude codes 0..126 are monotonic in value: binary-search the neighbours of a, take the nearest,
     * ties to the even code (= even mantissa bit), which is round-to-nearest-even. */
    int lo = 0, hi = 126;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (dsv4_e4m3_table[mid] <= a) lo = mid; else hi = mid;
    }
    float vl = dsv4_e4m3_table[lo], vh = dsv4_e4m3_table[hi];
    int code;
    if (a - vl < vh - a) code = lo;
    else if (a - vl > vh - a) code = hi;
    else code = (lo & 1) ? hi : lo;
    return sign | (uint8_t)code;
}

float e8m0_to_f32(uint8_t b) {
    if (b == 255) return NAN;
    if (b == 0) return u2f(0x00400000u);          /* 2^-127 is a denormal */
    return u2f((uint32_t)b << 23);
}

const float dsv4_e2m1_table[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

uint8_t f32_to_e2m1(float x) {
    uint8_t sign = signbit(x) ? 8 : 0;
    float a = fabsf(x);
    if (isnan(x)) return 7;
    if (a >= 6.0f) return sign | 7;
    int lo = 0;
    while (lo < 7 && dsv4_e2m1_table[lo + 1] <= a) lo++;
    if (lo == 7) return sign | 7;
    float vl = dsv4_e2m1_table[lo], vh = dsv4_e2m1_table[lo + 1];
    int code;
    if (a - vl < vh - a) code = lo;
    else if (a - vl > vh - a) code = lo + 1;
    else code = (lo & 1) ? lo + 1 : lo;         /* tie: even mantissa bit = even code */
    return sign | (uint8_t)code;
}

float pow2_ceil(float v) {
    uint32_t u = f2u(v);
    int e = (int)((u >> 23) & 0xff) - 127;
    if (u & 0x7fffffu) e += 1;
    return ldexpf(1.0f, e);
}

/* The definition, one element at a time; act_quant.c has the fast form (and falls back to this one). */
void act_quant_fp8_ref(float *x, int n, int block) {
    for (int b0 = 0; b0 < n; b0 += block) {
        int len = n - b0 < block ? n - b0 : block;
        float amax = 1e-4f;
        for (int i = 0; i < len; i++) amax = fmaxf(amax, fabsf(x[b0 + i]));
        float s = pow2_ceil(amax * (1.0f / 448.0f));
        for (int i = 0; i < len; i++) {
            float q = fminf(fmaxf(x[b0 + i] / s, -448.0f), 448.0f);
            x[b0 + i] = round_bf16(e4m3_to_f32(f32_to_e4m3(q)) * s);
        }
    }
}

void round_bf16_ref(float *x, long n) {
    for (long i = 0; i < n; i++) x[i] = round_bf16(x[i]);
}

float e2m1_nearest(float q) {
    const float a = fabsf(q), big = 0x1p23f;
    const float k = a < 2.0f ? 2.0f : a < 4.0f ? 1.0f : 0.5f;   /* grid points a unit: spacing 0.5, 1, 2 */
    const float r = ((a * k + big) - big) / k;                   /* a * k <= 12: + 2^23 rounds it to an integer, ties even */
    return copysignf(r, q);
}

/* The official rule (amax floored at 6 * 2^-126, s = 2^ceil(log2(amax / 6)), x <- bf16(E2M1(x / s) * s)), written
 * without calls: fmaxf / fminf as comparisons that ignore a NaN as they do, E2M1 by e2m1_nearest; GCC vectorises
 * both loops. test_formats holds it to the table form, bf16(e2m1_to_f32(f32_to_e2m1(q)) * s). */
void act_quant_fp4_inplace(float *x, int n, int block) {
    const float amin = 6.0f * 0x1p-126f;
    for (int b0 = 0; b0 < n; b0 += block) {
        const int len = n - b0 < block ? n - b0 : block;
        float amax = amin;
        for (int i = 0; i < len; i++) {
            const float a = fabsf(x[b0 + i]);
            amax = a > amax ? a : amax;
        }
        const float s = pow2_ceil(amax / 6.0f);
        for (int i = 0; i < len; i++) {
            float q = x[b0 + i] / s;
            q = q > -6.0f ? q : -6.0f;
            q = q < 6.0f ? q : 6.0f;
            x[b0 + i] = round_bf16(e2m1_nearest(q) * s);
        }
    }
}

void hadamard_inplace(float *x, int n) {
    for (int h = 1; h < n; h <<= 1)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}
