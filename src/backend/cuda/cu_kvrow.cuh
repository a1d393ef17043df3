/* Shared by the attention and indexer kernels: one element of a stored KV row (state/kvrows.c's layouts, decoded
 * exactly) and the 4 x 4 fmaf tile step of their sequential dots. */
#pragma once
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_quant.cuh"
#include "dsv4.h"

#define KV_F32 DSV4_KV_F32
#define KV_BF16 DSV4_KV_BF16
#define ROW_INDEX 1   /* kv_row_kind KV_ROW_INDEX */

/* ---- stored rows (state/kvrows.c) ------------------------------------------------------------------------------ */

__device__ __forceinline__ float kv_elem(const cu_kvlay &l, const uint8_t *row, int i) {
    if (l.fmt == KV_F32) return ((const float *)row)[i];
    if (l.fmt == KV_BF16) return dev_bf16_to_f32(((const uint16_t *)row)[i]);
    if (l.kind == ROW_INDEX) {
        const uint8_t b = row[i / 2];
        return dev_e2m1((uint8_t)(i & 1 ? b >> 4 : b & 15)) * dev_e8m0(row[(l.width + 1) / 2 + i / 32]);
    }
    const int N = l.nope;
    if (i >= N) {
        const uint8_t *b = row + N + (N + 63) / 64 + 2 * (i - N);   /* may sit at an odd address */
        return dev_bf16_to_f32((uint16_t)(b[0] | b[1] << 8));
    }
    return dev_e4m3(row[i]) * dev_e8m0(row[N + i / 64]);
}

/* Column j of many stored rows, by one thread: where the column's bits sit is found once, then a row's bits are one
 * or two loads with no branch, so a thread can put all its loads of a tile in flight before it decodes (and so waits
 * for) the first one. F: KV_F32, KV_BF16 or KV_FP8 (a main row: fp8 part, its scale bytes, the bf16 RoPE part).
 * value(bits(row)) is kv_elem(l, row, j), bit for bit: the same decoding of the same bytes. */
template <int F> struct kv_col {
    int o0, o1;   /* byte offsets in the row: the element (its low byte), and the scale byte or its high byte */
    bool rope;    /* KV_FP8: j is in the bf16 RoPE part */
    __device__ __forceinline__ kv_col(const cu_kvlay &l, int j) {
        const int N = l.nope;
        rope = F == DSV4_KV_FP8 && j >= N;
        o0 = F == DSV4_KV_F32 ? 4 * j : F == DSV4_KV_BF16 ? 2 * j : rope ? N + (N + 63) / 64 + 2 * (j - N) : j;
        o1 = F == DSV4_KV_FP8 && !rope ? N + j / 64 : o0 + 1;
    }
    __device__ __forceinline__ uint32_t bits(const uint8_t *row) const {
        if (F == DSV4_KV_F32) return *(const uint32_t *)(row + o0);
        if (F == DSV4_KV_BF16) return *(const uint16_t *)(row + o0);
        return (uint32_t)row[o0] | (uint32_t)row[o1] << 8;   /* a RoPE element may sit at an odd address */
    }
    __device__ __forceinline__ float value(uint32_t v) const {
        if (F == DSV4_KV_F32) return __uint_as_float(v);
        if (F == DSV4_KV_BF16 || rope) return dev_bf16_to_f32((uint16_t)v);
        return dev_e4m3((uint8_t)v) * dev_e8m0((uint8_t)(v >> 8));
    }
};

/* acc[a][b] += the 4 products of q4[b] and r4[a], columns in order (x, y, z, w): one step of a 4 x 4 tile of
 * sequential fmaf dots (the indexer's scores, the chunked attention's scores). */
__device__ __forceinline__ void fma_tile4x4(float (&acc)[4][4], const float4 (&q4)[4], const float4 (&r4)[4]) {
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            acc[a][b] = fmaf(q4[b].x, r4[a].x, acc[a][b]);
            acc[a][b] = fmaf(q4[b].y, r4[a].y, acc[a][b]);
            acc[a][b] = fmaf(q4[b].z, r4[a].z, acc[a][b]);
            acc[a][b] = fmaf(q4[b].w, r4[a].w, acc[a][b]);
        }
}
