/* The compressor state machine (spec §8): turns every aligned chunk of m positions into one row.
 *
 * State per compressor (fp32): kv[rows][cols] and score[rows][cols], rows = coff*m, cols = coff*c, where
 * coff = 2 when the compressor overlaps (m = 4) and 1 otherwise (m = 128).
 *   m = 4:   rows 0..3 hold the previous complete chunk, rows 4..7 the chunk being filled. Chunk k pools 8
 *            slots: the A half (first c columns) of chunk k-1 and the B half (last c columns) of chunk k.
 *   m = 128: rows 0..127 hold the chunk being filled.
 * score rows hold Wgate x + ape[pos mod m] (ape by ABSOLUTE position). A fresh state has kv = 0 and
 * score = -inf, so chunk 0's missing A slots weigh nothing.
 *
 * Every token goes through compressor_push in position order — prefill, chunked prefill and decode alike —
 * so a row never depends on how the tokens were split into calls. */
#ifndef DSV4_CORE_COMPRESSOR_H
#define DSV4_CORE_COMPRESSOR_H
#include "model/model.h"
#include <stdint.h>

typedef struct {
    int ratio, overlap, width;  /* m, (m == 4), c */
    int rows, cols;             /* coff*m, coff*c */
    float *kv, *score;          /* [rows][cols] each, owned */
} dsv4_compressor_state;

int  compressor_state_init(dsv4_compressor_state *s, int ratio, int width);  /* allocates and resets */
void compressor_state_reset(dsv4_compressor_state *s);
void compressor_state_free(dsv4_compressor_state *s);
void compressor_state_copy(dsv4_compressor_state *dst, const dsv4_compressor_state *src); /* same shape */
size_t compressor_state_bytes(const dsv4_compressor_state *s);

/* Feed the projections of the token at position pos: K = Wkv x, Z = Wgate x + ape[pos mod m] (both
 * coff*c long). Returns 1 when this token completes chunk k = pos / m and writes the pooled row P_k (c floats,
 * before its norm/rope, spec §8.2) to `pooled`; 0 otherwise. */
int compressor_push(dsv4_compressor_state *s, const float *K, const float *Z, int64_t pos, float *pooled);

/* Post-process a pooled row into the stored row (spec §8.3): bf16 (OFFICIAL), RMSNorm, RoPE at the chunk
 * start k*m, then the QAT simulation: FP8 of the non-rope dims for the main compressor, Hadamard + FP4 for the
 * indexer's. */
void compressor_finish_row(dsv4_mode mode, const dsv4_compressor_weights *w, const dsv4_rope *rope, int rope_dim,
                           float eps, int is_indexer, int64_t chunk_start, float *row);
#endif
