/* mHC's post step of one element, shared by k_layer.cu's k_hc_post / k_hc_post_moe and k_mma.cu's epilogue that
 * does it in place of a store (wo_b at few tokens: mma_post). The streams x [hc][d] of one token, mx its CU_MIX
 * floats (post[8], then comb[hc][hc] from 8), fe the sub-layer's output of element e. */
#ifndef DSV4_CU_HC_POST_CUH
#define DSV4_CU_HC_POST_CUH
#include "backend/cuda/cu_common.cuh"

/* hc_post of one element e of token t, f its sub-layer output: stream k = bf16(post[k] f + sum_j comb[j][k] old_j),
 * j in order. */
__device__ __forceinline__ void hc_post_elem(int official, float fe, const float *mx, float *x, int hc, int d, int e) {
    float old[8];
    for (int j = 0; j < hc; j++) old[j] = x[(int64_t)j * d + e];
    for (int k = 0; k < hc; k++) {
        float s = mx[k] * fe;
        for (int j = 0; j < hc; j++) s += mx[8 + j * hc + k] * old[j];
        x[(int64_t)k * d + e] = dev_bf16_if(official, s);
    }
}

/* The same for hc = 4 with every load (the streams, post, comb) issued before the first store: above, each k's
 * mix loads wait behind the stores of the k before (they might alias), 4 memory latencies a launch. The same
 * expressions on the same values. */
__device__ __forceinline__ void hc_post_elem4(int official, float fe, const float *mx, float *x, int d, int e) {
    float old[4], pw[4], cw[16];
#pragma unroll
    for (int j = 0; j < 4; j++) old[j] = x[(int64_t)j * d + e];
#pragma unroll
    for (int k = 0; k < 4; k++) pw[k] = mx[k];
#pragma unroll
    for (int j = 0; j < 16; j++) cw[j] = mx[8 + j];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float s = pw[k] * fe;
#pragma unroll
        for (int j = 0; j < 4; j++) s += cw[j * 4 + k] * old[j];
        x[(int64_t)k * d + e] = dev_bf16_if(official, s);
    }
}

#endif
