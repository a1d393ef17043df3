/* Number formats of the official checkpoints and of the official activation simulation.
 * All decoders are exact in fp32 (every format here is a subset of fp32). */
#ifndef DSV4_MODEL_FORMATS_H
#define DSV4_MODEL_FORMATS_H
#include <stdint.h>

/* BF16: upper 16 bits of an IEEE fp32. */
static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}
/* fp32 -> bf16, round to nearest even; NaN stays NaN. Inline: the OFFICIAL rounding points call it per element
 * in loops (mHC, the MoE sum, RoPE), where a call per element showed in profiles. */
static inline uint16_t f32_to_bf16(float x) {
    union { float f; uint32_t u; } v = { x };
    uint32_t u = v.u;
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* x rounded to the nearest bf16, as fp32 */
static inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* FP8 E4M3 ("fn"): bias 7, no infinities, NaN = S.1111.111, max 448. */
float    e4m3_to_f32(uint8_t b);
uint8_t  f32_to_e4m3(float x);          /* RNE, saturating to +-448 (the official clamp), NaN -> 0x7f */
extern const float dsv4_e4m3_table[256];

/* UE8M0 scale byte: 2^(b-127); 255 is NaN. */
float    e8m0_to_f32(uint8_t b);

/* FP4 E2M1: codes 0..7 = 0,.5,1,1.5,2,3,4,6; 8..15 negatives. Element 2i in the low nibble. */
extern const float dsv4_e2m1_table[16];
static inline float e2m1_to_f32(uint8_t code) { return dsv4_e2m1_table[code & 15]; }
uint8_t  f32_to_e2m1(float x);          /* nearest, ties to even mantissa, saturating to +-6 */
float    e2m1_nearest(float q);         /* |q| <= 6: e2m1_to_f32(f32_to_e2m1(q)), computed (no table, no branch) */

/* Power-of-two scale 2^ceil(log2(v)) computed from the fp32 bit pattern, as the official kernels do. */
float    pow2_ceil(float v);

/* Official QAT simulations (spec §3.3, §3.4, §3.5), in place on fp32 values. */
void act_quant_fp8_inplace(float *x, int n, int block);   /* fake-quantize: x <- q*s, q in E4M3, per block */
void act_quant_fp8_ref(float *x, int n, int block);       /* the same, element by element (the definition) */
void round_bf16_array(float *x, long n);                  /* x[i] <- round_bf16(x[i]), vectorised */
void round_bf16_ref(float *x, long n);                    /* the same, element by element */
void act_quant_fp4_inplace(float *x, int n, int block);   /* fake-quantize: x <- q*s, q in E2M1, per block */
void hadamard_inplace(float *x, int n);                   /* Sylvester WHT scaled by n^-1/2; n power of 2 */
#endif
