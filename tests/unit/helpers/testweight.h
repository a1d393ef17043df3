/* Test helpers: random weight matrices in every storage format, for the kernel tests. */
#ifndef DSV4_TEST_TESTWEIGHT_H
#define DSV4_TEST_TESTWEIGHT_H
#include "model/weight.h"
#include <stdint.h>

typedef struct {
    dsv4_weight w;
    void *data;
    uint8_t *scale;
} test_weight;

/* A rows x cols matrix of random values (uniform in [-1, 1) for F32/BF16, random codes without NaN for FP8/FP4,
 * block scales 2^-7..2^4), drawn from *rng. big_scale (FP8): every other block scale 2^120 with values below 2,
 * beyond the folded-multiplier fast path of vec.h but still finite. NULL data on allocation failure. */
test_weight tw_make(dsv4_wfmt fmt, int rows, int cols, int big_scale, uint32_t *rng);
void tw_free(test_weight *t);
/* The generator tw_make uses: the next 24-bit value, and a float in [-1, 1). */
uint32_t tw_rnd(uint32_t *rng);
float tw_rndf(uint32_t *rng);
#endif
