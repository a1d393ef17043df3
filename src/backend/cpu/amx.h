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
#include <stdint.h>

/* Whether cpu_linear_amx can run here (AMX-BF16 granted by the kernel) and takes this weight's format. */
int cpu_amx_usable(const dsv4_weight *w);
/* y[t*ldy + o] (or y_rows[t][o] when y_rows is not NULL) = W x[t] in the order above, for t < T. */
void cpu_linear_amx(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx,
                    float *y, int ldy, float *const *y_rows);

/* The same in pieces, for callers that run several linears' rows in one pool dispatch (core/moe_experts.c):
 * the tokens x [T][cols] in the tiles' layout, made once (and shared by every weight of that width), then any
 * row ranges of any weights on any threads; each output gets the order above, so the bits are cpu_linear_amx's. */
enum { CPU_AMX_ROWS = 16 };   /* a row range starts at a multiple of this (and ends at one, or at w->rows) */
typedef struct {
    uint32_t *xv;             /* [n32/2][tpad]: token t's bf16 pair (x[2p], x[2p+1]) at xv[p*tpad + t] */
    int T, tpad, n32, cols;
} cpu_amx_tokens;
/* -1 when out of memory (b->xv NULL: the caller computes those rows with the fp32 kernels, as cpu_linear_amx does). */
int  cpu_amx_tokens_make(cpu_amx_tokens *b, const float *x, int T, int ldx, int cols);
void cpu_amx_tokens_free(cpu_amx_tokens *b);
/* y[t*ldy + o] = W x[t] for t < b->T and rows o in [r0, r1), on the calling pool thread; w->cols == b->cols. */
void cpu_amx_rows(const dsv4_weight *w, const cpu_amx_tokens *b, float *y, int ldy, int r0, int r1, int thread);
#endif
