/* The routed experts' plan tiles as the GEMM kernels take them (k_mma_gemm.cu, k_expert_nat.cu). An expert's tiles
 * hold consecutive pairs (the plan sorts pairs by expert, then token); its run of tiles is cut into groups of G
 * tiles counted from its first tile, and each group is one block tile. Block y takes the groups that start among
 * plan tiles [G y, G y + G) (a group may reach past them; a block may take none, one or several). A pair's outputs
 * have one order whatever group or block it falls in, so the cut changes no bit (test_gpu_gemm, test_gpu_mma). */
#ifndef DSV4_CU_PLAN_GROUPS_CUH
#define DSV4_CU_PLAN_GROUPS_CUH
#include "backend/cuda/cu_kernels.h"

/* Tiles a and a + 1 belong to one expert's run: the same expert, the pairs contiguous. */
__device__ __forceinline__ bool plan_same_run(const cu_moe_plan &plan, int a) {
    return plan.tile_expert[a] == plan.tile_expert[a + 1] && plan.tile_first[a] + plan.tile_count[a] == plan.tile_first[a + 1];
}

/* group(s, s1) for each group [s, s1) of plan tiles that block blockIdx.y takes, in increasing s. */
template <class F> __device__ __forceinline__ void plan_block_groups(const cu_moe_plan &plan, int G, F &&group) {
    const int nt = *plan.n_tiles, w0 = blockIdx.y * G, w1 = min(w0 + G, nt);
    int f = w0;   /* the first tile of the run that holds tile t */
    if (w0 < w1)
        while (f > 0 && plan_same_run(plan, f - 1)) f--;
    for (int t = w0; t < w1;) {
        /* the run [f, end), known up to w1 + G: enough for every group that starts before w1 */
        int end = t + 1;
        while (end < nt && end < w1 + G && plan_same_run(plan, end - 1)) end++;
        for (int s = f + (t - f + G - 1) / G * G; s < min(end, w1); s += G) group(s, min(s + G, end));
        t = f = end;
    }
}
#endif
