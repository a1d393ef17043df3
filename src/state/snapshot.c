/* Atomic speculative rollback (spec §15.4).
 *
 * Everything a sequence holds is either append-only or a ring indexed by absolute position, and every ring
 * keeps `max_spec` slots of slack beyond what the model reads:
 *   - window ring: ring_len = window + max_spec, so a step of k <= max_spec tokens from p0 overwrites only
 *     positions below p0 - window + 1, which no query at or after p0 reads;
 *   - compressor rings (compressor.h): hist_len = live span + max_spec, so the projections of every position a
 *     rollback could return to are still there;
 *   - compressed and indexer rows: append-only; a rollback truncates them to floor(a / m).
 * So a snapshot is just the position, and rolling back to p0 + keep is setting the position and the row counts:
 * no copy, no recomputation. The slots beyond the new position hold rejected data that nothing reads and that
 * save/restore does not write, so the state is byte-identical to never having seen the rejected tokens. */
#include "model/model.h"
#include "state/sequence.h"
#include "util/error.h"
#include <stdlib.h>

struct dsv4_seq_snapshot {
    const dsv4_seq *seq;
    int64_t pos;
    int max_spec;
};

void dsv4_seq_snapshot_free(dsv4_seq_snapshot *snap) { free(snap); }

int dsv4_seq_snapshot_new(const dsv4_seq *s, dsv4_seq_snapshot **out, dsv4_error *err) {
    if (!s || !out) return dsv4_fail(err, DSV4_E_ARG, "snapshot: missing sequence or output");
    dsv4_seq_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) return dsv4_fail(err, DSV4_E_NOMEM, "snapshot: out of memory");
    snap->seq = s;
    snap->pos = s->pos;
    snap->max_spec = s->model->max_spec;
    *out = snap;
    return 0;
}

int dsv4_seq_rollback(dsv4_seq *s, const dsv4_seq_snapshot *snap, int keep, dsv4_error *err) {
    if (!s || !snap) return dsv4_fail(err, DSV4_E_ARG, "rollback: missing sequence or snapshot");
    if (snap->seq != s) return dsv4_fail(err, DSV4_E_ARG, "rollback: the snapshot was taken of another sequence");
    const int64_t k = s->pos - snap->pos;
    if (k < 0)
        return dsv4_fail(err, DSV4_E_STATE, "rollback: the sequence (position %lld) is behind its snapshot (position %lld)",
                         (long long)s->pos, (long long)snap->pos);
    if (keep < 0 || keep > k)
        return dsv4_fail(err, DSV4_E_ARG, "rollback: keep = %d is outside 0..%lld (tokens since the snapshot)", keep, (long long)k);
    if (keep == k) return 0;
    if (k > snap->max_spec)
        return dsv4_fail(err, DSV4_E_STATE, "rollback: %lld tokens since the snapshot exceed max_spec = %d (the ring slack); "
                         "raise max_spec at load to speculate further", (long long)k, snap->max_spec);
    return seq_rewind(s, snap->pos + keep, err);
}

int seq_rewind(dsv4_seq *s, int64_t a, dsv4_error *err) {
    if (a < 0 || a > s->pos || s->pos - a > s->model->max_spec)
        return dsv4_fail(err, DSV4_E_STATE, "rewind: position %lld is not within max_spec = %d of %lld", (long long)a,
                         s->model->max_spec, (long long)s->pos);
    for (int L = 0; L < s->n_layers; L++) {
        dsv4_layer_state *ls = &s->layer[L];
        if (ls->comp.kv) ls->crows.n = a / ls->comp.ratio;
        if (ls->icomp.kv) ls->irows.n = a / ls->icomp.ratio;
    }
    s->pos = a;
    return 0;
}
