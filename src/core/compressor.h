/* The compressor state machine (spec §8): turns every aligned chunk of m positions into one row.
 *
 * State: the raw per-position projections K_t = Wkv x_t and Z_t = Wgate x_t + ape[t mod m] (fp32, coff*c wide,
 * coff = 2 when the compressor overlaps, i.e. m = 4), kept in a ring indexed by ABSOLUTE position
 * (slot = t mod hist_len). When position t completes chunk k = t / m, the row is pooled straight from the ring:
 *   m = 4:   8 slots per output column j: the A half (columns 0..c-1) of the positions of chunk k-1 and the B
 *            half (columns c..2c-1) of the positions of chunk k; chunk 0 has no A slots (weight 0).
 *   m = 128: the 128 positions of chunk k, one half.
 * This is the official rolling state (spec §8.4) written as "what each slot held", so nothing is copied at an
 * emission and nothing is ever stale: the state at position p is exactly the projections of positions
 * [live_first(p), p), where live_first(p) is the start of the current chunk, minus m when overlapping.
 *
 * hist_len = (overlap ? 2m : m) + slack. The slack (the model's max_spec) keeps every position that a
 * rollback of up to `slack` speculative tokens could still need: rolling back is only a matter of position.
 * Every token goes through compressor_push in position order — prefill, chunked prefill and decode alike —
 * so a row never depends on how the tokens were split into calls. */
#ifndef DSV4_CORE_COMPRESSOR_H
#define DSV4_CORE_COMPRESSOR_H
#include "model/model.h"
#include "state/statemem.h"
#include <stdint.h>

typedef struct {
    int ratio, overlap, width;  /* m, (m == 4), c */
    int cols;                   /* coff*c: floats per position in kv and score */
    int hist_len;               /* positions held by the ring */
    float *kv, *score;          /* [hist_len][cols] each, owned, in `mem`; slot = pos mod hist_len */
    const seq_mem *mem;
} dsv4_compressor_state;

/* 0, or -1: no memory. The rings are allocated in mem (zero-filled). */
int  compressor_state_init(dsv4_compressor_state *s, const seq_mem *mem, int ratio, int width, int slack);
void compressor_state_free(dsv4_compressor_state *s);
void compressor_state_copy(dsv4_compressor_state *dst, const dsv4_compressor_state *src); /* same shape */

/* The first position whose projections a state at position pos still needs (see above). */
int64_t compressor_live_first(const dsv4_compressor_state *s, int64_t pos);
/* The kv / score floats (cols each) of an absolute position held by the ring (addresses in s->mem). */
static inline float *compressor_kv_at(const dsv4_compressor_state *s, int64_t pos) {
    return s->kv + (pos % s->hist_len) * s->cols;
}
static inline float *compressor_score_at(const dsv4_compressor_state *s, int64_t pos) {
    return s->score + (pos % s->hist_len) * s->cols;
}

/* Feed the projections of the token at position pos: K = Wkv x, Z = Wgate x + ape[pos mod m] (both cols long).
 * Returns 1 when this token completes chunk k = pos / m and writes the pooled row P_k (c floats, before its
 * norm/rope, spec §8.2) to `pooled`; 0 otherwise. */
int compressor_push(dsv4_compressor_state *s, const float *K, const float *Z, int64_t pos, float *pooled);

/* Post-process a pooled row into the stored row (spec §8.3): bf16 (OFFICIAL), RMSNorm, RoPE at the chunk
 * start k*m, then the QAT simulation: FP8 of the non-rope dims for the main compressor, Hadamard + FP4 for the
 * indexer's. */
void compressor_finish_row(dsv4_mode mode, const dsv4_compressor_weights *w, const dsv4_rope *rope, int rope_dim,
                           float eps, int is_indexer, int64_t chunk_start, float *row);
#endif
