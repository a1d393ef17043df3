/* Rotary position embedding, interleaved pairs on the LAST rope_dim dims of a vector (spec §4). */
#ifndef DSV4_CORE_ROPE_H
#define DSV4_CORE_ROPE_H
#include "dsv4.h"
#include "model/model.h"
#include <stdint.h>

/* Rotate x[0 .. rope_dim) (the caller passes a pointer to the rope part) by position pos.
 * inverse = 1 rotates by -pos (used to de-rotate the attention output at the query position). */
void rope_apply(dsv4_mode mode, const dsv4_rope *r, int rope_dim, float *x, int64_t pos, int inverse);
#endif
