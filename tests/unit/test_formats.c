/* Number formats of the official checkpoints and activation simulation, against hand-computed values
 * (spec §2.2, §3.3-§3.5). Every expected value below was worked out by hand from the format definitions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "model/formats.h"
#include "model/e2m1_f16.h"

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Exact float equality that also tells +0 from -0. */
#define assert_float_bits(a, b) assert_int_equal(bits(a), bits(b))

/* ---- E4M3 ------------------------------------------------------------------------------------------------ */

static void e4m3_decode(void **st) {
    (void)st;
    assert_float_bits(e4m3_to_f32(0x00), 0.0f);
    assert_float_bits(e4m3_to_f32(0x80), -0.0f);
    assert_float_bits(e4m3_to_f32(0x01), 0.001953125f);      /* smallest subnormal: 1/8 * 2^-6 = 2^-9 */
    assert_float_bits(e4m3_to_f32(0x07), 0.013671875f);      /* largest subnormal: 7/8 * 2^-6 */
    assert_float_bits(e4m3_to_f32(0x08), 0.015625f);         /* smallest normal: 2^-6 */
    assert_float_bits(e4m3_to_f32(0x38), 1.0f);              /* e = 7 (bias), m = 0 */
    assert_float_bits(e4m3_to_f32(0x3c), 1.5f);
    assert_float_bits(e4m3_to_f32(0x40), 2.0f);
    assert_float_bits(e4m3_to_f32(0x77), 240.0f);            /* 2^7 * 1.875 */
    assert_float_bits(e4m3_to_f32(0x7e), 448.0f);            /* max finite: 2^8 * 1.75 */
    assert_float_bits(e4m3_to_f32(0xfe), -448.0f);
    assert_float_bits(e4m3_to_f32(0xb8), -1.0f);
    assert_true(isnan(e4m3_to_f32(0x7f)));
    assert_true(isnan(e4m3_to_f32(0xff)));
    /* no infinities: every byte other than the two NaNs is finite */
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f) assert_true(isfinite(e4m3_to_f32((uint8_t)b)));
}

static void e4m3_table_matches_decoder(void **st) {
    (void)st;
    for (int b = 0; b < 256; b++) {
        float t = dsv4_e4m3_table[b], d = e4m3_to_f32((uint8_t)b);
        if (isnan(d)) assert_true(isnan(t));
        else assert_float_bits(t, d);
    }
}

static void e4m3_encode(void **st) {
    (void)st;
    assert_int_equal(f32_to_e4m3(0.0f), 0x00);
    assert_int_equal(f32_to_e4m3(-0.0f), 0x80);
    assert_int_equal(f32_to_e4m3(1.0f), 0x38);
    assert_int_equal(f32_to_e4m3(-2.0f), 0xc0);
    assert_int_equal(f32_to_e4m3(0.001953125f), 0x01);       /* 2^-9 exactly */
    assert_int_equal(f32_to_e4m3(0.0010f), 0x01);            /* just above half of 2^-9: rounds up */
    assert_int_equal(f32_to_e4m3(0.0009765625f), 0x00);      /* 2^-10: tie between 0 and 2^-9 -> even (0) */
    assert_int_equal(f32_to_e4m3(0.0029296875f), 0x02);      /* 3*2^-10: tie between codes 1 and 2 -> 2 */
    assert_int_equal(f32_to_e4m3(0.0146484375f), 0x08);      /* 15/16*2^-6: tie subnormal 7 / normal 8 -> 8 */
    assert_int_equal(f32_to_e4m3(1.0625f), 0x38);            /* tie 1.0 / 1.125 -> even mantissa (1.0) */
    assert_int_equal(f32_to_e4m3(1.1875f), 0x3a);            /* tie 1.125 / 1.25 -> 1.25 */
    assert_int_equal(f32_to_e4m3(1.07f), 0x39);              /* above the tie -> 1.125 */
    assert_int_equal(f32_to_e4m3(17.0f), 0x58);              /* tie 16 / 18 -> 16 */
    assert_int_equal(f32_to_e4m3(19.0f), 0x5a);              /* tie 18 / 20 -> 20 */
    assert_int_equal(f32_to_e4m3(424.0f), 0x7d);             /* 416 + 8: nearer 416 */
    assert_int_equal(f32_to_e4m3(432.0f), 0x7e);             /* tie 416 / 448 -> 448 (even) */
    assert_int_equal(f32_to_e4m3(448.0f), 0x7e);
    assert_int_equal(f32_to_e4m3(500.0f), 0x7e);             /* saturates, never NaN */
    assert_int_equal(f32_to_e4m3(-1000.0f), 0xfe);
    assert_int_equal(f32_to_e4m3(INFINITY), 0x7e);
    assert_int_equal(f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(f32_to_e4m3(NAN), 0x7f);
    /* every finite code round-trips */
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f) assert_int_equal(f32_to_e4m3(e4m3_to_f32((uint8_t)b)), b);
}

/* ---- E8M0 ------------------------------------------------------------------------------------------------ */

static void e8m0(void **st) {
    (void)st;
    assert_float_bits(e8m0_to_f32(127), 1.0f);
    assert_float_bits(e8m0_to_f32(128), 2.0f);
    assert_float_bits(e8m0_to_f32(126), 0.5f);
    assert_float_bits(e8m0_to_f32(117), 0.0009765625f);      /* 2^-10 */
    assert_float_bits(e8m0_to_f32(254), from_bits(0x7f000000u)); /* 2^127 */
    assert_float_bits(e8m0_to_f32(1), from_bits(0x00800000u));   /* 2^-126, smallest normal */
    assert_float_bits(e8m0_to_f32(0), from_bits(0x00400000u));   /* 2^-127, a subnormal: there is no zero */
    assert_true(isnan(e8m0_to_f32(255)));
}

/* ---- E2M1 ------------------------------------------------------------------------------------------------ */

static void e2m1_table(void **st) {
    (void)st;
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int c = 0; c < 8; c++) {
        assert_float_bits(e2m1_to_f32((uint8_t)c), mag[c]);
        assert_float_bits(e2m1_to_f32((uint8_t)(c + 8)), -mag[c]);   /* 8 is -0 */
    }
    assert_float_bits(e2m1_to_f32(0x5a), e2m1_to_f32(0x0a));        /* only the low nibble counts */
}

static void e2m1_encode(void **st) {
    (void)st;
    assert_int_equal(f32_to_e2m1(0.0f), 0);
    assert_int_equal(f32_to_e2m1(0.25f), 0);     /* tie 0 / 0.5 -> code 0 (even) */
    assert_int_equal(f32_to_e2m1(0.3f), 1);
    assert_int_equal(f32_to_e2m1(0.75f), 2);     /* tie 0.5 / 1 -> 1 */
    assert_int_equal(f32_to_e2m1(1.25f), 2);     /* tie 1 / 1.5 -> 1 */
    assert_int_equal(f32_to_e2m1(1.75f), 4);     /* tie 1.5 / 2 -> 2 */
    assert_int_equal(f32_to_e2m1(2.5f), 4);      /* tie 2 / 3 -> 2 */
    assert_int_equal(f32_to_e2m1(2.6f), 5);
    assert_int_equal(f32_to_e2m1(3.5f), 6);      /* tie 3 / 4 -> 4 */
    assert_int_equal(f32_to_e2m1(5.0f), 6);      /* tie 4 / 6 -> 4 */
    assert_int_equal(f32_to_e2m1(5.1f), 7);
    assert_int_equal(f32_to_e2m1(7.0f), 7);      /* saturates */
    assert_int_equal(f32_to_e2m1(-0.5f), 9);
    assert_int_equal(f32_to_e2m1(-6.0f), 15);
    assert_int_equal(f32_to_e2m1(-100.0f), 15);
    for (int c = 0; c < 16; c++)
        if (c != 8) assert_int_equal(f32_to_e2m1(e2m1_to_f32((uint8_t)c)), c);
}

/* e2m1_nearest (computed) against the code path, e2m1_to_f32(f32_to_e2m1(q)), bit for bit: every bf16 value in
 * [-6, 6], the 64 floats each side of every grid value and midpoint (the ties), and 2^20 random floats; then
 * act_quant_fp4_inplace against the official rule written with the code path, on blocks with zeros, NaNs, infinities
 * and huge and tiny values. */
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static void e2m1_nearest_check(float q) {
    const float want = e2m1_to_f32(f32_to_e2m1(q)), got = e2m1_nearest(q);
    if (memcmp(&want, &got, sizeof want)) fail_msg("e2m1_nearest(%a) = %a, the code gives %a", (double)q, (double)got, (double)want);
}
static void e2m1_nearest_is_the_code(void **st) {
    (void)st;
    for (uint32_t b = 0; b < 65536; b++) {
        const float q = bits_f32(b << 16);
        if (fabsf(q) <= 6.0f) e2m1_nearest_check(q);
    }
    static const float points[] = { 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f };
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++)
        for (int d = -64; d <= 64; d++) {
            uint32_t u;
            memcpy(&u, &points[i], sizeof u);
            const float q = bits_f32(u + (uint32_t)d);
            if (q <= 6.0f) e2m1_nearest_check(q), e2m1_nearest_check(-q);
        }
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < (1 << 20); i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        e2m1_nearest_check((float)((double)(r >> 11) / 9007199254740992.0 * 12.0 - 6.0));
    }
    enum { N = 256 };
    float x[N], ref[N];
    for (int t = 0; t < 64; t++) {
        for (int i = 0; i < N; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            const int e = (int)(r % 60) - 30;
            x[i] = ldexpf((float)((int64_t)(r >> 40) - (1 << 23)) / (float)(1 << 23), e);
        }
        if (t % 4 == 1) x[3] = 0.0f, x[40] = NAN, x[77] = -INFINITY;
        if (t % 4 == 2) for (int i = 0; i < 32; i++) x[i] = ldexpf(1.0f, -140);   /* a block of tiny values: amax floored */
        if (t % 4 == 3) x[100] = 3e38f;
        for (int b0 = 0; b0 < N; b0 += 32) {   /* the rule, with the code path */
            float amax = 6.0f * ldexpf(1.0f, -126);
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b0 + i]));
            const float s = pow2_ceil(amax / 6.0f);
            for (int i = 0; i < 32; i++)
                ref[b0 + i] = round_bf16(e2m1_to_f32(f32_to_e2m1(fminf(fmaxf(x[b0 + i] / s, -6.0f), 6.0f))) * s);
        }
        act_quant_fp4_inplace(x, N, 32);
        if (memcmp(x, ref, sizeof x)) fail_msg("act_quant_fp4_inplace differs from the rule (round %d)", t);
    }
}

/* ---- BF16 ------------------------------------------------------------------------------------------------ */

/* The GPU's FP4 decode (model/e2m1_f16.h): each nibble of every byte, read as an IEEE f16 (decoded here by the
 * definition) and times 2^14, is the E2M1 value, sign included. */
static void e2m1_f16_bits(void **st) {
    (void)st;
    static const float mag[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };
    for (uint32_t b = 0; b < 256; b++) {
        const uint32_t pair = e2m1x2_f16_bits(b);
        for (int half = 0; half < 2; half++) {
            const uint32_t h = (pair >> (16 * half)) & 0xffffu, code = (b >> (4 * half)) & 15u;
            const uint32_t E = (h >> 10) & 31u, M = h & 1023u;
            float v = E ? ldexpf((float)(1024u + M), (int)E - 25) : ldexpf((float)M, -24);
            if (h & 0x8000u) v = -v;
            const float want = (code & 8u) ? -mag[code & 7u] : mag[code & 7u];
            const float got = ldexpf(v, 14);
            if (memcmp(&got, &want, sizeof got)) fail_msg("byte 0x%02x nibble %d: f16 0x%04x * 2^14 = %g, want %g", b, half, h, got, want);
        }
    }
}

static void bf16(void **st) {
    (void)st;
    assert_int_equal(f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(f32_to_bf16(-2.0f), 0xc000);
    assert_float_bits(bf16_to_f32(0xc000), -2.0f);
    assert_float_bits(bf16_to_f32(0x3f80), 1.0f);
    assert_int_equal(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);   /* 1 + 2^-8: tie -> even (0x3f80) */
    assert_int_equal(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);   /* 1 + 3*2^-8: tie -> even (0x3f82) */
    assert_int_equal(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);   /* just above the tie */
    assert_int_equal(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);   /* just below the tie */
    assert_int_equal(f32_to_bf16(from_bits(0xbf818000u)), 0xbf82);   /* negative tie */
    assert_int_equal(f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);   /* FLT_MAX rounds to +inf */
    assert_int_equal(f32_to_bf16(from_bits(0x00000001u)), 0x0000);   /* tiny subnormal -> +0 */
    /* NaN stays NaN, including a NaN whose payload lives only in the low 16 bits */
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
    assert_true(isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
    assert_true(isnan(bf16_to_f32(f32_to_bf16(from_bits(0xff800001u)))));
    assert_float_bits(round_bf16(3.14159f), 3.140625f);                /* 0x40490fd0 -> 0x4049 */
    assert_float_bits(round_bf16(1.0f / 3.0f), from_bits(0x3eab0000u)); /* 0x3eaaaaab: low half > tie -> up */
}

/* ---- pow2_ceil ------------------------------------------------------------------------------------------- */

static void pow2(void **st) {
    (void)st;
    assert_float_bits(pow2_ceil(1.0f), 1.0f);
    assert_float_bits(pow2_ceil(1.5f), 2.0f);
    assert_float_bits(pow2_ceil(3.0f), 4.0f);
    assert_float_bits(pow2_ceil(4.0f), 4.0f);
    assert_float_bits(pow2_ceil(0.3f), 0.5f);
    assert_float_bits(pow2_ceil(from_bits(0x3f800001u)), 2.0f);       /* one ulp above 1 */
    assert_float_bits(pow2_ceil(3.0f / 448.0f), 0.0078125f);           /* 2^-7 */
    assert_float_bits(pow2_ceil(from_bits(0x00000010u)), from_bits(0x00800000u)); /* subnormal -> 2^-126 */
}

/* ---- activation simulations ------------------------------------------------------------------------------- */

static void act_fp8(void **st) {
    (void)st;
    /* block 1: amax 3 -> s = 2^ceil(log2(3/448)) = 2^-7; x/s = 384, -128, 12.8, 0 -> E4M3 384, -128, 13, 0
     * block 2: amax clamped to 1e-4 -> s = 2^-22; 1e-6/s = 4.19 -> 4 -> 4*2^-22 = 2^-20 */
    float x[8] = {3.0f, -1.0f, 0.1f, 0.0f, 1e-6f, 0.0f, -0.0f, 0.0f};
    act_quant_fp8_inplace(x, 8, 4);
    assert_float_bits(x[0], 3.0f);
    assert_float_bits(x[1], -1.0f);
    assert_float_bits(x[2], 0.1015625f);
    assert_float_bits(x[3], 0.0f);
    assert_float_bits(x[4], 0.00000095367431640625f);
    assert_float_bits(x[6], -0.0f);
    /* a block with a value that needs RNE at the top of the range: amax 448 -> s = 1; 433 -> 448 (tie is 432) */
    float y[3] = {448.0f, 433.0f, 17.0f};
    act_quant_fp8_inplace(y, 3, 128);
    assert_float_bits(y[0], 448.0f);
    assert_float_bits(y[1], 448.0f);
    assert_float_bits(y[2], 16.0f);
    /* partial last block: n = 5, block 4. Block 1 (all ones): s = 2^-8, 1 -> 256 exact. Block 2 = {0.7}:
     * 0.7/448 = 0.0015625 -> s = 2^-9; 0.7/s = 358.4 -> E4M3 spacing 32 in [256, 512): 352 -> 352*2^-9 = 0.6875 */
    float z[5] = {1, 1, 1, 1, 0.7f};
    act_quant_fp8_inplace(z, 5, 4);
    for (int i = 0; i < 4; i++) assert_float_bits(z[i], 1.0f);
    assert_float_bits(z[4], 0.6875f);
}

static uint32_t lcg = 777u;
static uint32_t next_u32(void) { lcg = lcg * 1664525u + 1013904223u; return lcg ^ (lcg >> 15); }

/* The vectorised forms (model/act_quant.c) against the element-by-element definitions, bit for bit: random
 * magnitudes over many binades, values on E4M3 ties and on the subnormal/normal boundary, zeros of both signs,
 * tiny values, and blocks holding NaN, infinities or huge values (which must take the definition's path). */
static void act_fp8_fast_matches_definition(void **st) {
    (void)st;
    enum { N = 128 * 40 };
    static float a[N], b[N];
    for (int i = 0; i < N; i++) {
        const int blk = i / 128, kind = next_u32() % 8;
        const float mag = ldexpf(1.0f, (int)(next_u32() % 40) - 30 + blk % 5);
        const float sign = next_u32() & 1 ? -1.0f : 1.0f;
        float v = sign * mag * ((float)(next_u32() % 100000) / 100000.0f);
        if (kind == 0) v = sign * ldexpf((float)(next_u32() % 64) + 0.5f, (int)(next_u32() % 20) - 25);   /* ties */
        if (kind == 1) v = sign * ldexpf(7.5f + (float)(next_u32() % 3) * 0.25f, -9 - (int)(next_u32() % 20));
        if (kind == 2) v = next_u32() & 1 ? -0.0f : 0.0f;
        a[i] = v;
    }
    a[128 * 3 + 5] = NAN;
    a[128 * 4 + 9] = INFINITY;
    a[128 * 5 + 1] = -INFINITY;
    a[128 * 6 + 2] = 3e38f;
    for (int i = 128 * 7; i < 128 * 8; i++) a[i] = 1e-9f * (float)(i % 7) - 3e-9f;   /* amax floored at 1e-4 */
    static const int blocks[] = {128, 64, 16, 48, 4};
    for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
        memcpy(b, a, sizeof a);
        act_quant_fp8_inplace(a, N - 17, blocks[k]);   /* a partial last block too */
        act_quant_fp8_ref(b, N - 17, blocks[k]);
        assert_memory_equal(a, b, sizeof a);
        memcpy(a, b, sizeof a);   /* the next round quantizes quantized values (already on the grid) */
    }
}

static void bf16_array_matches_definition(void **st) {
    (void)st;
    enum { N = 100003 };
    static float a[N], b[N];
    for (int i = 0; i < N; i++) {
        uint32_t u = next_u32();
        if (i % 5 == 0) u = (u & 0xffff0000u) | 0x8000u;   /* exact ties */
        if (i % 7 == 0) u |= 0x7f800000u;                  /* infinities and NaNs */
        memcpy(&a[i], &u, 4);
    }
    memcpy(b, a, sizeof a);
    round_bf16_array(a, N);
    round_bf16_ref(b, N);
    assert_memory_equal(a, b, sizeof a);
}

static void act_fp4(void **st) {
    (void)st;
    /* block 1: amax 6 -> s = 1: 6, 1.25 (tie -> 1), -0.7 (-> -0.5), 2.6 (-> 3)
     * block 2: amax 12 -> s = 2: 12/2=6, 5/2=2.5 (tie -> 2) -> 4, -1/2 = -0.5 -> -1, 0.2/2 = 0.1 -> 0
     * block 3: amax 7 -> s = 2: 3.5 (tie -> 4) -> 8, 0.5/2 = 0.25 (tie -> 0) -> 0 */
    float x[12] = {6.0f, 1.25f, -0.7f, 2.6f, 12.0f, 5.0f, -1.0f, 0.2f, 7.0f, 0.5f, -7.0f, 1.0f};
    act_quant_fp4_inplace(x, 12, 4);
    const float want[12] = {6, 1, -0.5f, 3, 12, 4, -1, 0, 8, 0, -8, 1};
    for (int i = 0; i < 12; i++) assert_float_bits(x[i], want[i]);
}

static void hadamard(void **st) {
    (void)st;
    /* n = 4: H4 x / 2 for x = 1,2,3,4: rows (++++), (+-+-), (++--), (+--+) -> 10, -2, -4, 0 -> /2 */
    float x[4] = {1, 2, 3, 4};
    hadamard_inplace(x, 4);
    const float w4[4] = {5, -1, -2, 0};
    for (int i = 0; i < 4; i++) assert_float_bits(x[i], w4[i]);
    /* n = 8, x = e0 + e7: y_r = (1 + (-1)^popcount(r)) / sqrt(8) -> 2/sqrt8 at r = 0,3,5,6, else 0 */
    float y[8] = {1, 0, 0, 0, 0, 0, 0, 1};
    hadamard_inplace(y, 8);
    const float w8[8] = {0.70710678f, 0, 0, 0.70710678f, 0, 0.70710678f, 0.70710678f, 0};
    for (int i = 0; i < 8; i++) assert_true(fabsf(y[i] - w8[i]) < 1e-6f);
    /* e0 alone: every output 1/sqrt(8); applying the orthonormal transform twice gives x back */
    float z[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    hadamard_inplace(z, 8);
    for (int i = 0; i < 8; i++) assert_true(fabsf(z[i] - 0.35355339f) < 1e-6f);
    hadamard_inplace(z, 8);
    assert_true(fabsf(z[0] - 1.0f) < 1e-6f);
    for (int i = 1; i < 8; i++) assert_true(fabsf(z[i]) < 1e-6f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(e4m3_decode),  cmocka_unit_test(e4m3_table_matches_decoder), cmocka_unit_test(e4m3_encode),
        cmocka_unit_test(e8m0),         cmocka_unit_test(e2m1_table),  cmocka_unit_test(e2m1_encode), cmocka_unit_test(e2m1_nearest_is_the_code),
        cmocka_unit_test(e2m1_f16_bits),
        cmocka_unit_test(bf16),         cmocka_unit_test(pow2),        cmocka_unit_test(act_fp8),
        cmocka_unit_test(act_fp4),      cmocka_unit_test(hadamard),
        cmocka_unit_test(act_fp8_fast_matches_definition), cmocka_unit_test(bf16_array_matches_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
