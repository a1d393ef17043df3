/* Sinkhorn normalisation of the mHC combination matrix (spec §6.2), written once for both backends: the CPU's
 * hc_sinkhorn (core/hc.c) and the CUDA kernel (backend/cuda/k_layer.cu) include this, so the two run the same
 * operations in the same order (one thread, sequentially; n is hc_mult, at most 8). In place on C [n][n]:
 * a row softmax plus eps, then a column normalisation, then (iters - 1) rounds of rows and columns, with eps in
 * every denominator. */
#ifndef DSV4_CORE_SINKHORN_H
#define DSV4_CORE_SINKHORN_H
#include <math.h>

#ifdef __CUDACC__
#define DSV4_HOST_DEVICE __host__ __device__
#else
#define DSV4_HOST_DEVICE
#endif

static inline DSV4_HOST_DEVICE void sinkhorn_inplace(float *C, int n, int iters, float eps) {
    for (int j = 0; j < n; j++) {
        float mx = C[j * n];
        for (int k = 1; k < n; k++) mx = fmaxf(mx, C[j * n + k]);
        float s = 0.0f;
        for (int k = 0; k < n; k++) { C[j * n + k] = expf(C[j * n + k] - mx); s += C[j * n + k]; }
        for (int k = 0; k < n; k++) C[j * n + k] = C[j * n + k] / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < n; j++) {
                float s = 0.0f;
                for (int k = 0; k < n; k++) s += C[j * n + k];
                for (int k = 0; k < n; k++) C[j * n + k] /= s + eps;
            }
        for (int k = 0; k < n; k++) {
            float s = 0.0f;
            for (int j = 0; j < n; j++) s += C[j * n + k];
            for (int j = 0; j < n; j++) C[j * n + k] /= s + eps;
        }
    }
}
#endif
