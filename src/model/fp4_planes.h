/* FP4 weights in nibble planes (WF_FP4P, model/weight.h): a layout of the same codes that the CPU's pair-order
 * kernels decode with one shuffle per 32 weights instead of two.
 *
 * The checkpoint packs columns 2i and 2i + 1 into byte i (low nibble first), so turning 32 codes into 32 16-bit
 * table indices takes a byte shuffle, a shift of the odd words and the table lookup (backend/cpu/isa/pairs.c,
 * fp4_bf16x32). In planes, each 128 columns of a row are 32 16-bit words and word k holds, in its nibble j, the code
 * of column 32 j + k: one 64-byte load gives four chunks of 32 columns, chunk j's indices are the words shifted
 * right by 4 j (the lookup reads each word's low 5 bits; the table's upper half repeats its lower one), and no
 * byte shuffle is left. Every value decodes to what it did in the checkpoint's layout, so every result is the
 * same bits; only the instructions differ.
 *
 * Who uses it, where the linears take the pair order on an AVX-512 set (fp4_planes_wanted): the host arena of a
 * GPU model with experts in host memory (issue 15: a private copy the GPU never reads, whose experts the host
 * computes for a token or a few at a time; by default, DSV4_CPU_FP4_PLANES=0 turns it off), and, opted in with
 * DSV4_CPU_FP4_PLANES=1, a CPU model's routed experts where its weights are a private copy (model.c,
 * cpu_fp4_planes). Readers other than the fused and tile paths (the fp32 decoders of the
 * other sets, a row dot) get the row back in the checkpoint's layout through fp4_planes_row_view. */
#ifndef DSV4_MODEL_FP4_PLANES_H
#define DSV4_MODEL_FP4_PLANES_H
#include "model/weight.h"
#include "util/error.h"
#include <stdint.h>

/* One row's bytes (cols / 2, cols a multiple of 128) from the checkpoint's layout into planes, in place. */
void fp4_planes_pack_row(uint8_t *row, int cols);
/* Columns [c0, c0 + n) of a planes row (c0 and n multiples of 128) back into the checkpoint's layout at dst
 * (n / 2 bytes; dst[0] holds columns c0 and c0 + 1). */
void fp4_planes_unpack(const uint8_t *row, int c0, int n, uint8_t *dst);
/* Whether w can be held in planes: FP4 whose rows are whole 128-column groups. */
int fp4_planes_fits(const dsv4_weight *w);
/* w (fp4_planes_fits, data writable) repacked in place: fmt WF_FP4P. -1 (w unchanged) when w is
 * not such a weight. `data` must be w's own memory: the caller says it may be written. */
int fp4_planes_weight(dsv4_weight *w, void *data);
/* Row `row` of a WF_FP4P weight as a one-row WF_FP4 weight over buf (cols / 2 bytes), the same scales. */
dsv4_weight fp4_planes_row_view(const dsv4_weight *w, int row, uint8_t *buf);
/* How many of a model's routed expert weights (w1, w2, w3 of every expert of every layer) are in planes. */
struct dsv4_model;
long fp4_planes_routed(const struct dsv4_model *m);
/* Whether FP4 weights that only the CPU reads should be repacked, for a model whose linears take the pair order
 * (pairs: core/numerics.h's OFFICIAL order, not AMX nor fp32) on the CPU kernel set `isa` (cpu_kernels name): the
 * fused kernels of the AVX-512 sets read planes. DSV4_CPU_FP4_PLANES=1 or 0 says yes or no; unset, by_default
 * (the caller's: on for a split GPU model's host arena, off for a CPU model; measurements in fp4_planes.c); any
 * other value is a DSV4_E_ARG error naming it, -1. Faster at 1-4 tokens a call (decode), slower at 5-16. */
int fp4_planes_wanted(int pairs, const char *isa, int by_default, dsv4_error *err);
#endif
