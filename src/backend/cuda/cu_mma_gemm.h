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

/* The switch, process-wide (read by cuda_model_init from DSV4_CUDA_GEMM; tests flip it): the path is taken for
 * T >= min_t (min_t >= 1; 0 turns it off). Default: on, from CU_MMA_GEMM_MIN_T tokens. */
#define CU_MMA_GEMM_MIN_T 256
void cu_mma_gemm_set(int min_t);
int cu_mma_gemm_min_t(void);

#ifdef __cplusplus
}
#endif
#endif
