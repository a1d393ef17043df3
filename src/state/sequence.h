/* A sequence owns all of its state as plain data (DESIGN §2, spec §15.1):
 *   - position and token history;
 *   - per layer: the window ring of K=V rows (slot = pos mod ring_len, ring_len = window + max_spec so a
 *     speculative write never clobbers a row that a rollback could still need), the compressor rolling states
 *     (main, and the indexer's on ratio-4 layers), the append-only compressed rows and indexer rows.
 * Nothing else in the model is stateful. */
#ifndef DSV4_STATE_SEQUENCE_H
#define DSV4_STATE_SEQUENCE_H
#include "core/compressor.h"
#include "dsv4.h"
#include "state/kvrows.h"
#include "state/statemem.h"
#include <stdint.h>

/* Append-only rows of fixed width, stored in the model's KV format (state/kvrows.h). */
/* Append-only rows. A fork shares its parent's rows (copy-on-write): `refs` points to the count of sequences
 * sharing `data` (NULL when this one owns it alone). Rows below n never change, so sharing is safe until
 * someone appends: rows_reserve, which every writer calls first, gives the writer its own copy. */
typedef struct {
    uint8_t *data;   /* [cap][lay.bytes], in `mem` */
    int64_t n, cap;
    kv_layout lay;
    int *refs;       /* host memory */
    const seq_mem *mem;
} dsv4_rows;

/* Capacity for n_total rows, owned alone when any row at or above n will be written; 0 or -1 (no memory). */
int  rows_reserve(dsv4_rows *r, int64_t n_total);
/* Share src's rows with dst (whose own rows are released): a fork without copying. */
int  rows_share(dsv4_rows *dst, dsv4_rows *src);
void rows_release(dsv4_rows *r);
/* Row k (an address in r->mem: dereference only for host rows). */
static inline uint8_t *rows_at(const dsv4_rows *r, int64_t k) { return r->data + (size_t)k * r->lay.bytes; }

typedef struct {
    uint8_t *ring;                /* [ring_len][kv_main.bytes]: window rows in the KV format, in the seq's mem */
    dsv4_compressor_state comp;   /* ratio != 0 */
    dsv4_compressor_state icomp;  /* ratio == 4 */
    dsv4_rows crows;              /* compressed rows [n][head_dim] */
    dsv4_rows irows;              /* indexer rows [n][index_head_dim] */
} dsv4_layer_state;

struct dsv4_seq {
    const struct dsv4_model *model;
    int64_t pos;                  /* tokens processed */
    int32_t *tokens;              /* history [pos] */
    int64_t tokens_cap;
    int n_layers, ring_len;
    kv_layout kv_main;            /* window and compressed rows (head_dim, rope tail) */
    kv_layout kv_index;           /* indexer rows (index_head_dim) */
    const seq_mem *mem;           /* where rings and rows live (host, or the model's device) */
    dsv4_layer_state *layer;
};

/* A new empty sequence whose state lives in `mem` (dsv4_seq_new picks the model's device; the speculative
 * heads keep their own small states in host memory whatever the device). */
int seq_new_in(struct dsv4_model *m, const seq_mem *mem, struct dsv4_seq **out, dsv4_error *err);

/* The ring slot of position pos (an address in s->mem). */
static inline uint8_t *seq_ring_at(const struct dsv4_seq *s, const dsv4_layer_state *ls, int64_t pos) {
    return ls->ring + (size_t)(pos % s->ring_len) * s->kv_main.bytes;
}

/* Set the position back to a (pos - max_spec <= a <= pos): what dsv4_seq_rollback does, without a snapshot. The
 * state is then exactly what processing only the first a tokens made it (the rings' slack keeps what a needs). */
int seq_rewind(struct dsv4_seq *s, int64_t a, dsv4_error *err);

/* Reserve room for n more tokens (history and every layer's rows) so that a step cannot fail half-way. */
int seq_reserve(struct dsv4_seq *s, int64_t n_more);

/* A benchmark's stand-in for a long prompt (dsv4 bench --context): an empty sequence jumps to position n as if
 * it had processed n tokens whose rows and compressor projections were all zero — every count and capacity
 * exactly what n real tokens leave (floor(n / ratio) compressed and indexer rows), nothing computed. For timing
 * decode at long contexts without a prefill of n tokens; the values are those of no real prompt. */
int seq_fast_forward_zero(struct dsv4_seq *s, int64_t n, dsv4_error *err);
#endif
