/* The shims' tests' random numbers: a xorshift64 stream, the same sequence on every run (header-only; each test
 * program includes it once). */
#ifndef DSV4_SHIM_RNG_H
#define DSV4_SHIM_RNG_H
#include <cstdint>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static inline uint32_t next_u32() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static inline int below(int n) { return (int)(next_u32() % (uint32_t)n); }
static inline float frand(float scale) { return ((float)(next_u32() & 0xffffff) / (float)(1 << 23) - 1.0f) * scale; }
#endif
