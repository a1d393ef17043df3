/* OFFICIAL-mode linear layers on FP8 tensor cores (k_mma.cu, issue 18): y[t][o] = sum_i W[o][i] x[t][i] with W
 * in FP8 E4M3 (128x128 UE8M0 block scales) or FP4 E2M1 (a UE8M0 scale per 32 columns of a row) and x the act-
 * quantized input as E4M3 bytes with one fp32 power-of-two scale per 128 columns of a row. The model's OFFICIAL
 * steps use them where cu_mma_takes says so (cuda_step.c, cuda_ep.c); test and benchmark: tests/gpu/test_gpu_mma.c.
 *
 * Reduction order of y[t][o] (k_mma.cu states it in full): four partial sums, partial p taking the 128-column
 * chunks c = p, p + 4, p + 8, ... in increasing order; each chunk's tensor-core partial sums go into a fresh fp32
 * fragment (FP8: one 128-column MMA chain; FP4: one MMA per 32-column scale block), which is multiplied by
 * (weight scale x activation scale) and added with one fmaf to the partial; then y = ((p0 + p1) + p2) + p3. The
 * order depends on the weight's column count only: never on T, the tile a token lands in, or its neighbours. */
#ifndef DSV4_CU_MMA_H
#define DSV4_CU_MMA_H
#include "backend/cuda/cu_kernels.h"
#include "dsv4.h"
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CU_MMA_ACT_BLOCK 128   /* columns per activation scale */
/* Row strides of packed rows of K columns: bytes (a multiple of 16) and scales. */
static inline int cu_mma_ld(int K) { return (K + 15) / 16 * 16; }
static inline int cu_mma_lds(int K) { return (K + CU_MMA_ACT_BLOCK - 1) / CU_MMA_ACT_BLOCK; }

/* Pack T rows x[t*ldx + i] (i < K) for the tensor-core linears: E4M3 bytes xq[t*ldq + i] and one power-of-two
 * scale xs[t*lds + i/128] per 128-column block, by act_quant's rule (the scale from the block's amax; each value
 * x / s rounded to nearest even E4M3). So packing the raw rows IS the OFFICIAL activation quantization: the step
 * packs raw rows and makes the fp32 act_quant copy only for a linear that runs on CUDA cores.
 * Packing the act_quant copy instead gives the same products: its blocks are q * s with q an E4M3 value, the scale
 * recomputed from them is s or s / 2 (a block whose amax rounded down to 224 s), never larger, so the bytes are q
 * or 2 q (exact, at most 448) and every tensor-core sum is the same sum times 1 or 2, undone exactly by the scale.
 * ldq a multiple of 16 >= K, xq 16-byte aligned, lds >= ceil(K / 128). 0, or DSV4_E_ARG with one line in err. */
/* Every one of the 2^32 float bit patterns through dev_f32_to_e4m3 (the hardware conversion by default) and through
 * the code search it replaced: *mismatches, *first the smallest mismatching pattern (0xffffffff: none). A test. */
int cu_mma_e4m3_check(unsigned long long *mismatches, unsigned int *first, dsv4_error *err);
/* cu_mma_frag.cuh's written-out E4M3 MMA against the instruction (random fragments and accumulators): the elements
 * that differ, of `checked` compared. GPU only. */
int cu_mma_emu_check(unsigned long long *mismatches, unsigned long long *checked, dsv4_error *err);
int cu_mma_pack_act(cu_stream st, const float *x, int ldx, int T, int K, uint8_t *xq, int ldq, float *xs, int lds,
                    dsv4_error *err);

/* y[t*ldy + o] for t < T, o < w->rows, from xq / xs as cu_mma_pack_act writes them (w->cols columns). FP8 weights:
 * cols a multiple of 128, data 16-byte aligned; FP4: cols a multiple of 32, data 4-byte aligned. out_bf16: each
 * y rounded to BF16 after its last addition (the OFFICIAL linears' BF16 output: one kernel fewer). 0, or
 * DSV4_E_UNSUPPORTED (another weight format) / DSV4_E_ARG (shape, stride or alignment) with one line in err;
 * nothing is launched then.
 * stream: 1 = up to 8 tokens go through the streaming kernel (k_mma_stream.cu: a persistent grid, the weight bytes
 * by cp.async through shared memory, for decode's memory-bound steps), 0 = k_mma.cu's small-tile kernel; the same
 * bits either way (test_gpu_stream). The model passes DSV4_CUDA_STREAM (cuda_model.mma_stream). The same argument
 * in cu_mma_linear_pair and the expert calls below. */
int cu_mma_linear(cu_stream st, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T, float *y,
                  int ldy, int out_bf16, int stream, dsv4_error *err);

/* FP4 weight loads (k_mma.cu, MMA_FP4_VEC): mode 2 (the build's default unless built with -DMMA_FP4_VEC=0 or 1):
 * lane-wide 16-byte weight loads and one scale word a lane, rearranged into the MMA fragments by shuffles; 1: the
 * same weight loads, a scale byte a lane; 0: one 4-byte word a lane and MMA, a scale byte a lane and MMA. The same
 * bits in every mode (test_gpu_mma compares them). For tests and benchmarks: process-wide, not thread-safe; set it
 * before launching. Another mode number means 0. Returns the mode it replaces. */
int cu_mma_fp4_vec(int mode);

/* FP4 experts whose columns are a multiple of 128 (k_mma.cu, MMA_EXPERT_LEAN, default 1): 1 = k_mma_expert_lean
 * (fewer instructions a byte; the same bits, test_gpu_mma), 0 = the FP4 load mode's kernel above. For tests and
 * benchmarks, as cu_mma_fp4_vec. Returns the value it replaces. */
int cu_mma_expert_lean(int on);

/* FP4 experts packed for the tensor cores (k_mma.cu states the layout): cu_fp4_frag_pack rewrites rows x cols FP4
 * codes at data in place (cols a multiple of 128, data 16-byte aligned; DSV4_E_ARG otherwise, nothing touched).
 * Experts so packed are passed to cu_mma_expert_linear(_pair) as format CU_FMT_FP4_FRAG (GPU memory only, never a
 * file's format; no CUDA-core or streaming path reads it) and give the bits of the same experts unpacked as WF_FP4.
 * Mode 2 of cu_mma_expert_lean (tests, benchmarks): WF_FP4 experts of whole 128-column chunks count as packed. */
#define CU_FMT_FP4_FRAG 0x46
/* The packed expert kernel's variant (k_mma.cu: prefetch depth and block bound), for benchmarks; returns the one
 * replaced. */
int cu_mma_expert_frag_variant(int v);
int cu_fp4_frag_pack(cu_stream st, void *data, int64_t rows, int cols, dsv4_error *err);

/* FP4 experts on native FP8 tensor cores (k_expert_nat.cu states the order and the layout; issue 18): the model packs
 * its routed experts with cu_fp4_nat_pack at load when DSV4_CUDA_NATIVE_EXPERTS=1 (cuda_model.c) and passes them as
 * format CU_FMT_FP4_NAT to cu_mma_expert_linear(_pair), which hands them to cu_nat_experts. The native sum is another
 * arithmetic than mma.sync's: these experts' bits are their own (equal across steps, chunkings and batches), not
 * those of the same experts in CU_FMT_FP4_FRAG or WF_FP4. GPU memory only, never a file's format. */
#define CU_FMT_FP4_NAT 0x47
int cu_fp4_nat_pack(cu_stream st, void *data, int64_t rows, int cols, dsv4_error *err);
/* The routed experts' tiles of a plan (cu_mma_expert_linear's contract; nz = 2: experts_b into y_b too, as the pair
 * call) on native experts of `cols` columns (a multiple of 128): k_nat_gemm when max_tiles >= the GEMM threshold,
 * else k_nat_small. The same bits either way. 0, or DSV4_E_UNSUPPORTED (cols, shared memory) with one line in err. */
int cu_nat_experts(cu_stream st, int nz, const dsv4_weight *experts_a, const dsv4_weight *experts_b, int rows, int cols,
                   const cu_moe_plan *plan, int max_tiles, const uint8_t *xq, int ldq, const float *xs, int lds, int x_by_pair,
                   float *y_a, float *y_b, int ldy, int out_bf16, dsv4_error *err);
/* The GEMM threshold in plan tiles (process-wide, for tests and benchmarks: 0 = never the GEMM, 1 = always; returns
 * the one replaced). Default CU_NAT_GEMM_MIN_TILES: a step of ~340 tokens and more at top-6. */
#define CU_NAT_GEMM_MIN_TILES 512
int cu_nat_gemm_min_tiles(int min_tiles);

/* cu_mma_linear of a weight of d rows at T <= 8 tokens whose output y is the sub-layer's output of mHC's post step
 * (wo_b): instead of storing y, the epilogue applies cu_hc_post's step to each element — X [T][4][d] updated with
 * mix [T][CU_MIX] (cu_kernels.h) — with the bytes cu_mma_linear (out_bf16 = official) then cu_hc_post would leave
 * in X. 1 when launched; 0 when it declines (T > 8, hc != 4, the streaming path, another shape: nothing launched,
 * the caller does the two steps); -1 with one line in err for what cu_mma_linear refuses. */
int cu_mma_linear_post(cu_stream st, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T, const float *mix,
                       float *X, int hc, int d, int official, int stream, dsv4_error *err);

/* Two weights over the same packed rows in one launch (wq_a and wkv, the shared expert's w1 and w3: twice the
 * blocks of one, for a decode step's small weights): y_a = x w_a^T and y_b = x w_b^T, each with the bits
 * cu_mma_linear gives it (the same blocks, told apart by blockIdx.z). Both weights taken by cu_mma_linear, of one
 * format and column count (DSV4_E_ARG otherwise); nothing is launched on an error. Built with -DMMA_LINEAR_PAIR=0
 * it makes the two launches instead. */
int cu_mma_linear_pair(cu_stream st, const dsv4_weight *w_a, float *y_a, int ldy_a, const dsv4_weight *w_b, float *y_b, int ldy_b,
                       const uint8_t *xq, int ldq, const float *xs, int lds, int T, int out_bf16, int stream, dsv4_error *err);

/* Whether cu_mma_linear takes weight w (its format, shape, alignment and scales: never T), and whether
 * cu_mma_expert_linear takes experts of format fmt with `cols` columns. */
int cu_mma_takes(const dsv4_weight *w);
int cu_mma_takes_experts(int fmt, int cols);

/* The routed experts' tiles of a MoE plan (as cu_expert_linear): tile i is expert plan->tile_expert[i] over its
 * pairs; pair p reads packed row p (x_by_pair) or plan->pair_token[p] of xq / xs and writes row p of y. Experts
 * whose data is NULL (another GPU's, or the host's) write EP_ABSENT_ROW. Every expert FP8 (cols a multiple of
 * 128) or FP4 (of 32), data aligned as for cu_mma_linear. 0, or an error with one line in err. */
int cu_mma_expert_linear(cu_stream st, const dsv4_weight *experts, int rows, int cols, int fmt, const cu_moe_plan *plan,
                         int max_tiles, const uint8_t *xq, int ldq, const float *xs, int lds, int x_by_pair, float *y,
                         int ldy, int out_bf16, int stream, dsv4_error *err);

/* Two projections of the same experts' input in one launch (w1 and w3: twice the blocks of one, so a decode step's
 * few tiles fill the GPU in fewer, fuller waves): y_a from experts_a and y_b from experts_b, each with the bits
 * cu_mma_expert_linear gives it (the same blocks, told apart by blockIdx.z). Arguments and errors as there.
 * Built with -DMMA_EXPERT_PAIR=0 it makes the two launches instead. */
int cu_mma_expert_linear_pair(cu_stream st, const dsv4_weight *experts_a, const dsv4_weight *experts_b, int rows, int cols, int fmt,
                              const cu_moe_plan *plan, int max_tiles, const uint8_t *xq, int ldq, const float *xs, int lds,
                              int x_by_pair, float *y_a, float *y_b, int ldy, int out_bf16, int stream, dsv4_error *err);

/* ---- BF16-input linears (k_mma16.cu) ----
 * OFFICIAL linears whose input is a bf16 tensor and whose weight is BF16 (or FP8 with 128x128 scales, which is
 * e4m3 x 2^k, a bf16 value): wo_a (grouped), the compressors' wkv / wgate (main and indexer), the indexer's
 * weights_proj, the router gate, the LM head. Their products are exact in fp32; on bf16 tensor cores with fp32
 * accumulation only the order of the additions differs from k_linear's. The order (k_mma16.cu states it in full):
 * four partial sums, partial p taking the 128-column chunks c = p, p + 4, ... in increasing order, each chunk's
 * products summed by MMAs into a fresh fp32 fragment that is added to the partial with one fmaf (times the FP8
 * block scale, or 1); then y = ((p0 + p1) + p2) + p3. A function of the weight's column count only. */

/* Row stride (elements, a multiple of 8 = 16 bytes) of packed bf16 rows of K columns. */
static inline int cu_mma16_ld(int K) { return (K + 7) / 8 * 8; }

/* xb[t*ldb + i] = bf16(x[t*ldx + i]) for t < T, i < K, rounded to nearest even: exact for the bf16-valued rows of
 * OFFICIAL mode. ldb a multiple of 8 >= K, xb 16-byte aligned. 0, or DSV4_E_ARG with one line in err. */
int cu_mma16_pack(cu_stream st, const float *x, int ldx, int T, int K, uint16_t *xb, int ldb, dsv4_error *err);

/* y[t*ldy + o] = sum_i W[o][i] xb[t*ldb + (o / (rows / groups)) * group_x + i] for t < T, o < w->rows: with
 * groups > 1, group g's rows read the input columns from g * group_x on (wo_a). W BF16 (cols a multiple of 32) or
 * FP8 (cols a multiple of 128, its 128x128 scales), data 16-byte aligned, views (row0) included; rows / groups a
 * multiple of 16 when groups > 1. ldb a multiple of 8 >= (groups - 1) * group_x + cols, group_x a multiple of 8,
 * xb 16-byte aligned, ldy >= rows. out_bf16: each output rounded to the nearest bf16 (ties to even) as it is stored,
 * the bits the rounding kernel would give. 0, or DSV4_E_UNSUPPORTED (another weight format) / DSV4_E_ARG (shape, stride or
 * alignment) with one line in err; nothing is launched then. Whether a weight is taken depends on its format and
 * shape only, never on T (up to 2,097,120 tokens). */
int cu_mma16_linear(cu_stream st, const dsv4_weight *w, int groups, const uint16_t *xb, int ldb, int group_x, int T, float *y, int ldy,
                    int out_bf16, dsv4_error *err);

/* Several weights over the same input rows in one launch (the compressors and the indexer's weights_proj, all
 * reading xn): y_j = xb W_j^T for each of n (1 to 6) weights, ungrouped, all BF16 or all FP8, each as
 * cu_mma16_linear takes it. Every row has the bits cu_mma16_linear gives it; 0, or the first weight's refusal
 * (nothing launched). */
typedef struct {
    const dsv4_weight *w;
    float *y;
    int ldy;
    int out_bf16;   /* as cu_mma16_linear's */
} cu_mma16_out;
int cu_mma16_linear_multi(cu_stream st, const cu_mma16_out *outs, int n, const uint16_t *xb, int ldb, int T, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
