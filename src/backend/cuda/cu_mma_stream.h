/* The streaming path of the FP8/FP4 tensor-core linears for up to 8 tokens (k_mma_stream.cu, issue 18: decode):
 * a persistent grid whose blocks walk a list of 16-row slabs, the weight bytes coming global -> shared memory by
 * cp.async through a ring of stages, with the reduction order of k_mma.cu (cu_mma.h), so every output has the bits
 * cu_mma_linear's small-tile kernel gives it (test_gpu_stream compares them by memcmp). k_mma.cu calls these first
 * when its caller asked for streaming (the `stream` argument of cu_mma_linear & co.); each returns 1 when it
 * launched, 0 when it did not (then the caller launches its own kernel: the same bits either way). */
#ifndef DSV4_CU_MMA_STREAM_H
#define DSV4_CU_MMA_STREAM_H
#include "backend/cuda/cu_kernels.h"
#include "dsv4.h"
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y_a = xq w_a^T and, when w_b is non-NULL, y_b = xq w_b^T (cu_mma_linear / cu_mma_linear_pair, whose argument
 * checks have passed; w_b of w_a's format and width), T <= 8 tokens. 0 (not launched) for T > 8 or when the
 * shared-memory opt-in fails. */
int cu_mma_stream_linear(cu_stream st, const dsv4_weight *w_a, float *y_a, int ldy_a, const dsv4_weight *w_b, float *y_b, int ldy_b,
                         const uint8_t *xq, int ldq, const float *xs, int lds, int T, int out_bf16);

/* The routed experts' tiles of a MoE plan (cu_mma_expert_linear / _pair, checks passed; tiles of at most
 * CU_MOE_TILE = 8 pairs): experts_a into y_a and, when experts_b is non-NULL, experts_b into y_b. 0 when not
 * launched (a plan whose tiles hold more than 8 pairs, or the opt-in failed). */
int cu_mma_stream_experts(cu_stream st, const dsv4_weight *experts_a, float *y_a, const dsv4_weight *experts_b, float *y_b, int rows,
                          int cols, int fmt, const cu_moe_plan *plan, int max_tiles, const uint8_t *xq, int ldq, const float *xs, int lds,
                          int x_by_pair, int ldy, int out_bf16);

#ifdef __cplusplus
}
#endif
#endif
