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
 * it did not (cu_mma_gemm_takes_linear below says no): the caller launches its own kernels then. The bits are the
 * same either way. */
int cu_mma_gemm_linear(cu_stream st, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T, float *y,
                       int ldy, int out_bf16);

/* The same for cu_mma_expert_linear (the routed experts' tiles of a MoE plan): 1 when it launched, 0 when not
 * (switched off, or max_tiles below the minimum, CU_MMA_GEMM_MIN_TILES by default: a step of fewer than ~2,000 tokens, whose experts get
 * a few pairs each). Host-side decisions only (max_tiles is a function of the step's T). Every present expert's
 * data must be 16-byte aligned (FP4 too: the model gives each expert an allocation of its own); the kernel traps
 * on one that is not. */
#define CU_MMA_GEMM_MIN_T 256
/* Blocks of 128 x 128 outputs the plain path needs before it takes a launch: one wave of the H200's 132 SMs. Run
 * 42's micro-benchmark (test_gpu_gemm --bench): at 16-64 blocks (a 2048-row weight at T = 256 or 512, a 4096-row
 * one at 256) the GEMM ran at 0.31-0.69x the small tiles, at 128 and more 1.17-1.31x. */
#define CU_MMA_GEMM_MIN_BLOCKS 128
#define CU_MMA_GEMM_MIN_TILES 2048
int cu_mma_gemm_experts(cu_stream st, const dsv4_weight *experts, int rows, int cols, int fmt, const cu_moe_plan *plan, int max_tiles,
                        const uint8_t *xq, int ldq, const float *xs, int lds, int x_by_pair, float *y, int ldy, int out_bf16);

/* The switch, process-wide (read by cuda_model_init from DSV4_CUDA_GEMM; tests flip it): the plain path is taken
 * for T >= min_t when its grid has >= min_blocks blocks, the experts' for max_tiles >= min_tiles (min_t or
 * min_tiles 0 turns that path off; negative counts as 0). Default: on, CU_MMA_GEMM_MIN_T tokens,
 * CU_MMA_GEMM_MIN_BLOCKS blocks, CU_MMA_GEMM_MIN_TILES tiles. */
void cu_mma_gemm_set(int min_t, int min_blocks, int min_tiles);
int cu_mma_gemm_min_t(void);
/* Which GEMM takes those launches (process-wide, as the switch): CU_GEMM_MMA, k_mma_gemm.cu's mma.sync block
 * (gemm_block), CU_GEMM_HGMMA, the default, its warpgroup block (hg_block: fp16 wgmma in the order of sm_90's
 * expansion of mma.sync e4m3) with two warpgroups of 64 x 128, CU_GEMM_HGMMA4 with four of 64 x 64 (slower: runs
 * 97-99). The same bits every way (test_gpu_gemm). Anything else counts as CU_GEMM_DEFAULT. Run 101 (one H200, 8K
 * prefill of the Flash shape): 1,862 tok/s with CU_GEMM_MMA, 2,136 with CU_GEMM_HGMMA. */
#define CU_GEMM_MMA 1
#define CU_GEMM_HGMMA 2
#define CU_GEMM_HGMMA4 3
#define CU_GEMM_DEFAULT CU_GEMM_HGMMA
void cu_mma_gemm_set_kind(int kind);
int cu_mma_gemm_kind(void);
int cu_mma_gemm_min_tiles(void);

/* Would cu_mma_gemm_linear take weight w at T tokens? (the switch, T, the grid's blocks and w's alignment) */
int cu_mma_gemm_takes_linear(const dsv4_weight *w, int T);

#ifdef __cplusplus
}
#endif
#endif
