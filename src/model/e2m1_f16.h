/* Two E2M1 codes as an f16 pair, by bit moves alone (the GPU's FP4 decode, backend/cuda/cu_common.cuh; Hopper has
 * no FP4 conversion instruction). For a code c = s e1 e0 m, the f16 with bits (c & 7) << 9 | (c & 8) << 12 is
 * e2m1(c) * 2^-14 exactly: the code's two exponent bits become the low bits of the f16 exponent field and its
 * mantissa bit the top mantissa bit, so exponent e >= 1 gives 2^(e-15) (1 + m/2) = 2^-14 * 2^(e-1) (1 + m/2), and
 * e = 0 is the f16 subnormal m * 2^-15 = 2^-14 * (m / 2) — E2M1's own subnormal. Both sides are exact, so the
 * decoded value times 2^14 is the table's value bit for bit (tests/unit/test_formats.c checks all 256 bytes). */
#ifndef DSV4_MODEL_E2M1_F16_H
#define DSV4_MODEL_E2M1_F16_H
#include <stdint.h>

#ifdef __CUDACC__
#define DSV4_E2M1_HD __host__ __device__
#else
#define DSV4_E2M1_HD
#endif

/* The byte b's low nibble (element 2i) -> bits 0..15, its high nibble (element 2i+1) -> bits 16..31. */
static inline DSV4_E2M1_HD uint32_t e2m1x2_f16_bits(uint32_t b) {
    const uint32_t t = (b & 0x0fu) | ((b & 0xf0u) << 12);
    return ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
}
#endif
