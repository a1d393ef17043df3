/* OFFICIAL-mode linears on Intel AMX (tile BF16 dot products), chosen at run time (cpufeat.h).
 *
 * When it applies: the caller promises that every input value is exactly a bf16 (OFFICIAL linear inputs are
 * FP8-quantized, q * 2^e with 4 significant bits), and the weight is BF16, FP8 or FP4, whose values times
 * their power-of-two scales are exact bf16 too. Every product is then exact and only the accumulation rounds.
 *
 * The accumulation order of an output y[t][o] (the same whatever T, the chunking or the threads): the weight
 * row o and the token x[t] are cut into 32-column tiles k = 0, 1, ..., ceil(cols/32)-1 (the last one padded
 * with zeros); one fp32 accumulator starts at +0 and takes one TDPBF16PS step per tile in increasing k. A step
 * adds the tile's 32 products to the accumulator the way the AMX unit does it (denormal inputs and outputs
 * flushed to zero; the unit's internal order within a step is its own: on Sapphire Rapids it matches neither
 * sequential FMAs nor one rounding of the exact sum, so no other instruction reproduces it). The AMX unit's
 * result for one (row, token) does not depend on the other rows or tokens in the tile (checked by
 * tests/unit/test_linear.c), which is what makes one token at a time and 128 at once give the same bits.
 *
 * Opt-in (dsv4_load_opts.cpu_amx, `dsv4 bench --amx`): on the 2-core Sapphire Rapids box it makes OFFICIAL
 * prefill ~2x faster but decode ~1.3x slower in CPU time than the fused fp32 dots (one token per tile step
 * leaves the unit 1/16 busy, and the decoded tiles go through memory), and a model's kernel cannot depend on
 * the batch. Results differ from the fp32 order within the accumulation's rounding; each is bit-identical with
 * itself across batches, chunkings and threads. */
#ifndef DSV4_CPU_AMX_H
#define DSV4_CPU_AMX_H
#include "backend/cpu/pool.h"
#include "model/weight.h"

/* Whether cpu_linear_amx can run here (AMX-BF16 granted by the kernel) and takes this weight's format. */
int cpu_amx_usable(const dsv4_weight *w);
/* y[t*ldy + o] (or y_rows[t][o] when y_rows is not NULL) = W x[t] in the order above, for t < T. */
void cpu_linear_amx(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx,
                    float *y, int ldy, float *const *y_rows);
#endif
