/* The lightning indexer's scores of a few rows against one query (core/attention.c select_rows, spec §9), compiled
 * once per instruction set (isa.h).
 *
 * A score (every set, bit for bit): for each head h = 0 .. nI-1, s_h = dot_f32(q_h, row) (kernels.h: 32 lanes of
 * FMAs, vec_reduce32's tree, then + the tail's sequential fmaf), s_h = bf16(s_h) in OFFICIAL mode; then over the
 * heads in order acc += s_h w_h (that product bf16 in OFFICIAL) where s_h > 0, from acc = 0; the score is acc
 * (bf16 in OFFICIAL).
 *
 * The AVX-512 form takes up to 8 rows a head at once (cI a multiple of 32): each row's 32 lanes in two zmm, as
 * dot_f32 has them, then the 8 rows' trees side by side (vec.h vec_tree16x8_zmm after the first level, lanes
 * j + j+16): every level is one vector add over two rows' (then four, eight) halves brought together by shuffles,
 * the same adds of the same values, 15 adds and 14 shuffles for 8 dots instead of 8 trees of 6 adds and 6
 * extractions. The head sum then runs in the lanes (one row a lane), in head order. At long contexts on the
 * CPU these scores were a quarter of a decode step (flash-2g at 64K tokens, 2 cores). */
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "model/formats.h"

static float score_row(const float *qi, const float *wi, const float *row, int nI, int cI, int official) {
    float acc = 0.0f;
    for (int h = 0; h < nI; h++) {
        float s = dot_f32(qi + (int64_t)h * cI, row, cI);
        if (official) s = round_bf16(s);
        if (s > 0.0f) {
            const float t = s * wi[h];
            acc += official ? round_bf16(t) : t;
        }
    }
    return official ? round_bf16(acc) : acc;
}

#if defined(DSV4_AVX512)
/* out[r] = score_row(rows[r]) for r < n <= 8 (rows beyond n repeat the last). Lane map of the tree's result:
 * lane 4k holds row k, lane 4k + 1 row k + 4 (k = 0..3); the other lanes copies. */
static void score_rows8(const float *qi, const float *wi, const float *const *rows, int n, int nI, int cI, int official,
                        float *out) {
    const float *rp[8];
    for (int r = 0; r < 8; r++) rp[r] = rows[r < n ? r : n - 1];
    const __m512 zero = _mm512_setzero_ps();
    __m512 acc = zero;
    for (int h = 0; h < nI; h++) {
        const float *q = qi + (int64_t)h * cI;
        __m512 z0[8], z1[8];
        for (int r = 0; r < 8; r++) z0[r] = z1[r] = zero;
        for (int i = 0; i < cI; i += 32) {   /* dot_f32's lanes: z0 = lanes 0-15, z1 = lanes 16-31 */
            const __m512 qa = _mm512_loadu_ps(q + i), qb = _mm512_loadu_ps(q + i + 16);
            for (int r = 0; r < 8; r++) {
                z0[r] = _mm512_fmadd_ps(qa, _mm512_loadu_ps(rp[r] + i), z0[r]);
                z1[r] = _mm512_fmadd_ps(qb, _mm512_loadu_ps(rp[r] + i + 16), z1[r]);
            }
        }
        /* lanes j + j+16: t[r] */
        __m512 t[8];
        for (int r = 0; r < 8; r++) t[r] = _mm512_add_ps(z0[r], z1[r]);
        /* the rest of the tree (vec.h), then + the tail (0: cI is a multiple of 32) */
        const __m512 d = _mm512_add_ps(vec_tree16x8_zmm(t), zero);
        const __m512 s = official ? vec_round_bf16_zmm(d) : d;
        const __mmask16 pos = _mm512_cmp_ps_mask(s, zero, _CMP_GT_OQ);
        __m512 term = _mm512_mul_ps(s, _mm512_set1_ps(wi[h]));
        if (official) term = vec_round_bf16_zmm(term);
        acc = _mm512_mask_add_ps(acc, pos, acc, term);
    }
    if (official) acc = vec_round_bf16_zmm(acc);
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
    for (int k = 0; k < 4; k++) {
        if (k < n) out[k] = lanes[4 * k];
        if (k + 4 < n) out[k + 4] = lanes[4 * k + 1];
    }
}
#endif

void ISA_FN(index_scores)(const float *qi, const float *wi, const float *const *rows, int n, int nI, int cI, int official,
                          float *out) {
#if defined(DSV4_AVX512)
    if (cI % 32 == 0 && n > 1) {
        score_rows8(qi, wi, rows, n, nI, cI, official, out);
        return;
    }
#endif
    for (int r = 0; r < n; r++) out[r] = score_row(qi, wi, rows[r], nI, cI, official);
}
