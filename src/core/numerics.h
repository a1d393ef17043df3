/* The two numeric modes (DESIGN §3). EXACT: fp32, no simulation. OFFICIAL: the official model's rounding
 * points (spec §16.1). Every rounding point in the forward pass goes through these helpers, so the EXACT path
 * is the OFFICIAL path with the roundings switched off. */
#ifndef DSV4_CORE_NUMERICS_H
#define DSV4_CORE_NUMERICS_H
#include "dsv4.h"
#include "model/formats.h"

static inline int is_official(dsv4_mode m) { return m == DSV4_MODE_OFFICIAL; }

/* Round n values to bf16 in OFFICIAL mode (no-op in EXACT). */
static inline void num_bf16(dsv4_mode m, float *x, long n) {
    if (!is_official(m)) return;
    round_bf16_array(x, n);
}
static inline float num_bf16_1(dsv4_mode m, float x) { return is_official(m) ? round_bf16(x) : x; }
#endif
