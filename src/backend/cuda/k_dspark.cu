/* The DSpark drafter's Markov and confidence heads around the shared kernels (cu_linear for the two products,
 * cu_sample for the draws): the two elementwise pieces that glue them, so that a whole draft runs on the device
 * (backend/cuda/cuda_step.c cuda_dspark_draft). */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"

__global__ void k_dspark_markov_in(int official, dsv4_weight w1, const int32_t *ids, int j, const float *y, int d, int rank,
                                   float *cat) {
    dev_grid_wait();
    const int prev = ids[j];
    float *out = cat + (int64_t)j * (d + rank);
    for (int i = threadIdx.x; i < d + rank; i += blockDim.x)
        out[i] = i < d ? y[(int64_t)j * d + i] : dev_bf16_if(official, dev_weight_at(w1, prev, i - d));
}

extern "C" void cu_dspark_markov_in(cu_stream st, int official, const dsv4_weight *w1, const int32_t *ids, int j, const float *y,
                                    int d, int rank, float *cat) {
    k_dspark_markov_in<<<1, 256, 0, (cudaStream_t)st>>>(official, *w1, ids, j, y, d, rank, cat);
}

__global__ void k_add_row(float *row, const float *add, int n) {
    dev_grid_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) row[i] = __fadd_rn(row[i], add[i]);
}

extern "C" void cu_add_row(cu_stream st, float *row, const float *add, int n) {
    if (n > 0) k_add_row<<<cu_blocks(n, 256), 256, 0, (cudaStream_t)st>>>(row, add, n);
}
