/* The random values a synthetic checkpoint's holes (model/synthetic.h) are filled with: one definition for the
 * GPU's fill (backend/cuda/k_synth.cu) and the host's (model/synthetic.c). A hole's bytes are a pure function of
 * its seed and the byte's position, so a run is repeatable and any piece of a hole can be filled on its own.
 * Magnitudes are tame on purpose (no NaN or Inf codes; FP8 values in [2^-2, 2^1) and FP4 values at most 6, times
 * the UE8M0 scale SYNTH_SCALE_BYTE; BF16 values in [2^-8, 2^-4)), so activations stay finite through every layer
 * and the timing is that of ordinary numbers. */
#ifndef DSV4_MODEL_SYNTH_VALUES_H
#define DSV4_MODEL_SYNTH_VALUES_H
#include <stdint.h>

#ifdef __CUDACC__
#define SYNTH_FN __host__ __device__ static inline
#else
#define SYNTH_FN static inline
#endif

/* What a hole holds: E4M3 bytes, packed E2M1 nibbles, or bf16s. Scale holes hold SYNTH_SCALE_BYTE throughout. */
enum { SYNTH_FP8 = 1, SYNTH_FP4 = 2, SYNTH_BF16 = 3 };
#define SYNTH_SCALE_BYTE 121   /* UE8M0 2^-6: values of size ~1/64, as a fan-in of a few thousand wants */

/* splitmix64's next output from state z: z advanced by the golden gamma, then the output function */
SYNTH_FN uint64_t synth_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Bytes 8w .. 8w + 7 of a hole of this kind and seed, from h = synth_mix(seed ^ synth_mix(w)) (byte k = bits 8k..): FP8 a random sign and mantissa with exponent field 5..8; FP4
 * any two nibbles; BF16 four values of random sign and mantissa with biased exponent 119..122. */
SYNTH_FN void synth_word(int kind, uint64_t seed, uint64_t w, uint8_t b[8]) {
    const uint64_t h = synth_mix(seed ^ synth_mix(w));
    if (kind == SYNTH_BF16) {
        for (int k = 0; k < 4; k++) {
            const uint32_t r = (uint32_t)(h >> (16 * k));
            const uint16_t v = (uint16_t)((r & 0x8000) | ((127 - 8 + ((r >> 7) & 3)) << 7) | (r & 0x7f));
            b[2 * k] = (uint8_t)v;
            b[2 * k + 1] = (uint8_t)(v >> 8);
        }
        return;
    }
    for (int k = 0; k < 8; k++) {
        const uint32_t r = (uint32_t)(h >> (8 * k));
        b[k] = kind == SYNTH_FP8 ? (uint8_t)((r & 0x80) | ((5 + ((r >> 3) & 3)) << 3) | (r & 7)) : (uint8_t)r;
    }
}
#endif
