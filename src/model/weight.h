/* A weight matrix as stored in the checkpoint (memory-mapped, never dequantized as a whole).
 * Row-major [rows][cols]; a linear layer computes y = W x. */
#ifndef DSV4_MODEL_WEIGHT_H
#define DSV4_MODEL_WEIGHT_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {   /* the CUDA kernels (C++) slice weights with weight_rows */
#endif

typedef enum {
    WF_F32,   /* fp32 values */
    WF_BF16,  /* bf16 values */
    WF_FP8,   /* E4M3 values, UE8M0 scale per 128x128 block: scale[(row/128)*scale_cols + col/128] */
    WF_FP4,   /* E2M1 nibbles (element 2i low), UE8M0 scale per 32 inputs: scale[row*scale_cols + col/32] */
    WF_FP4P,  /* FP4 in nibble planes, a host copy only the CPU kernels read (model/fp4_planes.h): cols a multiple
                 of 128; each 128 columns of a row are 64 bytes = 32 little-endian 16-bit words, word k holding the
                 E2M1 code of column 32 j + k in bits 4 j .. 4 j + 3 (j = 0..3); scales as WF_FP4 */
} dsv4_wfmt;

typedef struct {
    dsv4_wfmt      fmt;
    int            rows, cols;
    const void    *data;        /* row 0 of this view */
    const uint8_t *scale;       /* the whole scale tensor (FP8/FP4) */
    int            scale_cols;
    int            row0;        /* global row index of this view's row 0 (for block-scale lookup) */
} dsv4_weight;

/* The rows [r0, r0+n) of w as a weight of its own (no copy). */
dsv4_weight weight_rows(const dsv4_weight *w, int r0, int n);
/* Bytes of stored weight data (not counting scales). */
uint64_t weight_bytes(const dsv4_weight *w);
/* Bytes of ncols columns of one row (a row is weight_cols_bytes(w, w->cols); FP4 ncols even). */
uint64_t weight_cols_bytes(const dsv4_weight *w, int64_t ncols);
/* Bytes of its UE8M0 scales (FP8: one per 128 x 128 block, FP4: one per 32 weights of a row; 0 otherwise). */
uint64_t weight_scale_bytes(const dsv4_weight *w);
/* Decoding rows (exact) and dot products against them: see backend/cpu/kernels.h. */
#ifdef __cplusplus
}
#endif
#endif
