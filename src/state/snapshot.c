/* Atomic speculative rollback (spec §15.4).
 *
 * Design (exact by construction):
 *   snapshot at position p0 = the compressor states (main + indexer) of every layer, the row counts, and the
 *   max_spec ring slots that positions p0 .. p0+max_spec-1 will overwrite.
 *   rollback to keep of k speculative tokens:
 *     keep == k  nothing to undo;
 *     otherwise  restore the snapshot (compressor states, row counts truncated to p0/m, the saved ring slots,
 *                position p0), then re-run the kept tokens with dsv4_step.
 * Why re-run: a compressor state after position a-1 (p0 <= a < p0+k) cannot be rebuilt from the states
 * before and after the step, because the projections (K, Z) of the kept positions are not stored and later
 * speculative positions overwrite their slots. Re-running them is bit-identical (dsv4_step's parity: any
 * chunking equals one token at a time), and it makes the whole state — ring dead slots included — equal to
 * never having seen the rejected tokens. The cost is one forward pass over the kept tokens; keeping a ring of
 * the raw projections inside the forward (spec §15.4, second scheme) would remove it and is a later
 * optimisation that changes no result.
 *
 * The ring needs no other restore: ring_len = window + max_spec, so a step of k <= max_spec tokens starting at
 * p0 only overwrites positions < p0 - window + 1, which no query at or after p0 reads. */
#include "model/model.h"
#include "state/sequence.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
    dsv4_compressor_state comp, icomp;
    int64_t crows_n, irows_n;
    float *ring_slots;          /* [n_slots][head_dim]: slots (p0 + j) mod ring_len, j < n_slots */
} layer_snap;

struct dsv4_seq_snapshot {
    const dsv4_seq *seq;
    int64_t pos;
    int n_layers, n_slots;
    layer_snap *layer;
};

void dsv4_seq_snapshot_free(dsv4_seq_snapshot *snap) {
    if (!snap) return;
    if (snap->layer)
        for (int L = 0; L < snap->n_layers; L++) {
            compressor_state_free(&snap->layer[L].comp);
            compressor_state_free(&snap->layer[L].icomp);
            free(snap->layer[L].ring_slots);
        }
    free(snap->layer);
    free(snap);
}

/* Copy the ring slots that the next n_slots positions will write (or back, when restoring). */
static void ring_slots_xfer(const dsv4_seq *s, float *ring, float *slots, int64_t p0, int n_slots, int restore) {
    const size_t D = (size_t)s->model->cfg.head_dim;
    for (int j = 0; j < n_slots; j++) {
        float *slot = ring + ((p0 + j) % s->ring_len) * (int64_t)D;
        if (restore) memcpy(slot, slots + (size_t)j * D, sizeof(float) * D);
        else memcpy(slots + (size_t)j * D, slot, sizeof(float) * D);
    }
}

int dsv4_seq_snapshot_new(const dsv4_seq *s, dsv4_seq_snapshot **out, dsv4_error *err) {
    if (!s || !out) return dsv4_fail(err, DSV4_E_ARG, "snapshot: missing sequence or output");
    dsv4_seq_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) return dsv4_fail(err, DSV4_E_NOMEM, "snapshot: out of memory");
    snap->seq = s;
    snap->pos = s->pos;
    snap->n_layers = s->n_layers;
    snap->n_slots = s->model->max_spec < s->ring_len ? s->model->max_spec : s->ring_len;
    snap->layer = calloc((size_t)s->n_layers, sizeof(layer_snap));
    if (!snap->layer) goto oom;
    const size_t D = (size_t)s->model->cfg.head_dim;
    for (int L = 0; L < s->n_layers; L++) {
        const dsv4_layer_state *ls = &s->layer[L];
        layer_snap *ln = &snap->layer[L];
        ln->ring_slots = malloc(sizeof(float) * (size_t)snap->n_slots * D + 1);
        if (!ln->ring_slots) goto oom;
        ring_slots_xfer(s, ls->ring, ln->ring_slots, s->pos, snap->n_slots, 0);
        if (ls->comp.kv) {
            if (compressor_state_init(&ln->comp, ls->comp.ratio, ls->comp.width)) goto oom;
            compressor_state_copy(&ln->comp, &ls->comp);
        }
        if (ls->icomp.kv) {
            if (compressor_state_init(&ln->icomp, ls->icomp.ratio, ls->icomp.width)) goto oom;
            compressor_state_copy(&ln->icomp, &ls->icomp);
        }
        ln->crows_n = ls->crows.n;
        ln->irows_n = ls->irows.n;
    }
    *out = snap;
    return 0;
oom:
    dsv4_seq_snapshot_free(snap);
    return dsv4_fail(err, DSV4_E_NOMEM, "snapshot: out of memory");
}

/* Put the sequence back exactly as it was when the snapshot was taken. Cannot fail. */
static void restore_snapshot(dsv4_seq *s, const dsv4_seq_snapshot *snap) {
    for (int L = 0; L < s->n_layers; L++) {
        dsv4_layer_state *ls = &s->layer[L];
        const layer_snap *ln = &snap->layer[L];
        ring_slots_xfer(s, ls->ring, ln->ring_slots, snap->pos, snap->n_slots, 1);
        if (ls->comp.kv) compressor_state_copy(&ls->comp, &ln->comp);
        if (ls->icomp.kv) compressor_state_copy(&ls->icomp, &ln->icomp);
        ls->crows.n = ln->crows_n;   /* = floor(p0 / m): rows are append-only, truncation is the undo */
        ls->irows.n = ln->irows_n;
    }
    s->pos = snap->pos;
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
    if (k > snap->n_slots)
        return dsv4_fail(err, DSV4_E_STATE, "rollback: %lld tokens since the snapshot exceed max_spec = %d (the ring slack); "
                         "raise max_spec at load to speculate further", (long long)k, snap->n_slots);
    int32_t *kept = NULL;
    if (keep > 0) {
        kept = malloc(sizeof(int32_t) * (size_t)keep);
        if (!kept) return dsv4_fail(err, DSV4_E_NOMEM, "rollback: out of memory");
        memcpy(kept, s->tokens + snap->pos, sizeof(int32_t) * (size_t)keep);
    }
    restore_snapshot(s, snap);
    int rc = 0;
    if (keep > 0) {
        /* The sequence's model is const only so that readers cannot change it; a step needs its workspace. */
        dsv4_step_item it = { s, kept, keep, DSV4_LOGITS_NONE, NULL };
        rc = dsv4_step((dsv4_model *)s->model, &it, 1, err);
        if (rc) dsv4_wrap(err, "rollback: re-running the %d kept tokens failed, the sequence is back at position %lld",
                          keep, (long long)snap->pos);
    }
    free(kept);
    return rc;
}
