/* RMSNorm (spec §3.1) and the unweighted per-head q normalisation (spec §3.2). */
#ifndef DSV4_CORE_NORM_H
#define DSV4_CORE_NORM_H
#include "dsv4.h"

/* y = w * (x / sqrt(mean(x^2) + eps)); weight multiply in fp32 before the single (OFFICIAL) bf16 rounding.
 * x and y may alias. */
void rmsnorm(dsv4_mode mode, const float *x, const float *w, int n, float eps, float *y);
/* x <- x / sqrt(mean(x^2) + eps), no weight; OFFICIAL mode emulates the official BF16 arithmetic. */
void unit_rmsnorm(dsv4_mode mode, float *x, int n, float eps);
#endif
