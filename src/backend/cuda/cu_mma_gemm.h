/* The large-T path of the FP8/FP4 tensor-core linear (k_mma_gemm.cu): a tiled GEMM through shared memory with the
 * reduction order of k_mma.cu (cu_mma.h), so every output has the bits cu_mma_linear's small-tile kernel gives it.
 * cu_mma_linear calls it first; it takes the launch only when it is switched on and the shape suits it. */
#ifndef DSV4_CU_MMA_GEMM_H
#define DSV4_CU_MMA_GEMM_H
#include "backend/cuda/cu_kernels.h"
#include "dsv4.h"
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when it launched y = xq W^T for cu_mma_linear (whose argument checks have passed: the same arguments), 0 when
 * it did not (switched off, T below the switch's minimum, or a weight whose data is not 16-byte aligned): the
 * caller launches its own kernels then. The bits are the same either way. */
int cu_mma_gemm_linear(cu_stream st, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T, float *y,
                       int ldy, int out_bf16);

/* The same for cu_mma_expert_linear (the routed experts' tiles of a MoE plan): 1 when it launched, 0 when not
 * (switched off, or max_tiles below the minimum, CU_MMA_GEMM_MIN_TILES by default: a step of fewer than ~2,000 tokens, whose experts get
 * a few pairs each). Host-side decisions only (max_tiles is a function of the step's T). Every present expert's
 * data must be 16-byte aligned (FP4 too: the model gives each expert an allocation of its own); the kernel traps
 * on one that is not. */
#define CU_MMA_GEMM_MIN_T 256
#define CU_MMA_GEMM_MIN_TILES 2048
int cu_mma_gemm_experts(cu_stream st, const dsv4_weight *experts, int rows, int cols, int fmt, const cu_moe_plan *plan, int max_tiles,
                        const uint8_t *xq, int ldq, const float *xs, int lds, int x_by_pair, float *y, int ldy, int out_bf16);

/* The switch, process-wide (read by cuda_model_init from DSV4_CUDA_GEMM; tests flip it): the plain path is taken
 * for T >= min_t, the experts' for max_tiles >= min_tiles (0 turns either off; negative counts as 0). Default: on,
 * from CU_MMA_GEMM_MIN_T tokens and CU_MMA_GEMM_MIN_TILES tiles. */
void cu_mma_gemm_set(int min_t, int min_tiles);
int cu_mma_gemm_min_t(void);
int cu_mma_gemm_min_tiles(void);

#ifdef __cplusplus
}
#endif
#endif
