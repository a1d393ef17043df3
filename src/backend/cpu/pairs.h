/* OFFICIAL mode's linears on the CPU in the *pair order*: bf16 dot products, two columns at a time.
 *
 * When it applies: the caller promises that every input value is exactly a bf16 (OFFICIAL linear inputs are
 * FP8-quantized or rounded to bf16, core/numerics.h), and the weight is BF16, FP8 or FP4, whose values times
 * their power-of-two scales are bf16s too (a row is decoded to bf16 as backend/cpu/amx.h's rows are). Every
 * product is then exact in fp32 and only the accumulation rounds.
 *
 * The order of an output y[t][o], the same whatever T, the chunking, the threads or the instruction set: the
 * weight row w and the token x are cut into chunks of 32 columns c = 0, 32, 64, ... (the last one padded with
 * zeros). Sixteen fp32 lanes L[0..15] start at +0; for each chunk in increasing c, lane j takes
 *     L[j] = fl(L[j] + w[c+2j+1] x[c+2j+1]);   then   L[j] = fl(L[j] + w[c+2j] x[c+2j]);
 * (the odd column first; fl = one IEEE round-to-nearest-even, the product being exact). Then the lanes are added
 * by a halving tree: L[j] += L[j+s] for s = 8, 4, 2, 1, j < s; the result is L[0].
 *
 * Why this order: it is what one AVX512-BF16 VDPBF16PS does for one output, 32 columns an instruction (the
 * instruction's pseudocode in Intel's manual: two additions, odd element first, each rounded), so a CPU with it
 * multiplies twice as many columns per instruction as fp32 FMAs and needs no decode of FP8/FP4 to fp32. Every
 * other set (AVX-512 without BF16, AVX2, scalar) runs the same steps as fp32 FMAs: the bf16 pair of a dword
 * splits into two fp32s with one AND and one shift, so emulating costs what the fp32 order costs.
 *
 * Where the instruction and the fp32 steps could differ: VDPBF16PS treats denormal inputs as zero and flushes
 * denormal results (DAZ, FTZ). A (row, token) pair takes the instruction only when that cannot matter: all
 * products and partial sums are multiples of the smallest product's unit in the last place q, so when q >=
 * FLT_MIN no partial sum is denormal (it is 0 or at least q), and when the largest possible sum stays below
 * 2^127 none overflows. Both are decided from the exponent ranges of the decoded row and the token
 * (pairs_safe below); an unsafe pair (never in real checkpoints and activations) runs the fp32 steps. And the
 * instruction is used only on a CPU where a start-up check (pairs_selftest in isa/pairs.c) found it computing
 * exactly the steps above on cases that tell the candidate orders apart.
 *
 * Compared with the fp32 order of EXACT mode (kernels.h's dot_f32: 32 lanes of FMAs), only the rounding of the
 * accumulation differs; OFFICIAL's own rounding points (FP8, bf16) are unchanged. */
#ifndef DSV4_CPU_PAIRS_H
#define DSV4_CPU_PAIRS_H
#include "backend/cpu/pool.h"
#include "model/weight.h"
#include <stdint.h>

/* Whether the pair order takes this weight's format (BF16, FP8, FP4); other formats keep cpu_linear's order. */
int cpu_pairs_usable(const dsv4_weight *w);

/* Exponent range of a set of bf16 values: the smallest and largest biased exponent among the nonzero ones;
 * a denormal makes lo PAIRS_EXP_BAD_LO, an inf or NaN makes hi PAIRS_EXP_BAD_HI; all zero: lo = 255, hi = 0. */
enum { PAIRS_EXP_BAD_LO = -10000, PAIRS_EXP_BAD_HI = 10000 };
typedef struct {
    int lo, hi;
} pairs_exp;

/* A row and a token may take VDPBF16PS (see above): the smallest product unit 2^(lo_w + lo_x - 254 - 14) is at
 * least 2^-126, and n32 products below 2^(hi_w + hi_x - 252) each sum to less than 2^127. */
static inline int pairs_safe(pairs_exp w, pairs_exp x, int log2_n32) {
    return w.lo + x.lo >= 142 && w.hi + x.hi + log2_n32 <= 379;
}

/* The tokens of one linear, once per call (shared by every weight of that width): token t's bf16s at
 * xb[t * n32 + c], zero beyond cols, and its exponent range. */
typedef struct {
    uint16_t *xb;
    pairs_exp *range;
    int T, cols, n32, log2_n32;
} cpu_pairs_tokens;
/* -1 when out of memory (b->xb NULL). x's values must be bf16s (others are rounded to nearest even first). */
int  cpu_pairs_tokens_make(cpu_pairs_tokens *b, const float *x, int T, int ldx, int cols);
void cpu_pairs_tokens_free(cpu_pairs_tokens *b);

/* One call of the rows: y[t*ldy + o] (or y_rows[t][o]) for rows o of w, every token of b; w->cols == b->cols. */
typedef struct {
    const dsv4_weight *w;
    const cpu_pairs_tokens *b;
    float *y;
    float *const *y_rows;
    int ldy;
} cpu_pairs_job;

/* y = W x[t] in the pair order for t < T, rows split over the pool's threads (the pool's kernel set runs them).
 * Out of memory for the tokens: cpu_linear's order instead (as cpu_linear_amx does). */
void cpu_linear_pairs(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy,
                      float *const *y_rows);
#endif
