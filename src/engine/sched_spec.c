/* Speculative streams inside the continuous-batching scheduler (scheduler.h, dsv4_sched_spec).
 *
 * A speculating stream keeps the invariant of speculative.h: its sequence holds every committed token but
 * the pending one (the anchor). Its share of a step is [anchor, d_1..d_k] with every row's logits; after the
 * one dsv4_step of all streams, each speculating stream is verified on its own (dsv4_spec_verify_rows), its
 * emitted tokens go through the same finish rules as a plain stream's (EOS, stop sequences, length, the
 * constraint), and the sequence is rolled back to the committed tokens. Drafting (dsv4_spec_draft) and
 * verification are speculative.c's, so a stream here emits what a dsv4_spec_stream with the same drafter
 * emits; a greedy stream emits what it would without speculation. */
#include "engine/sched_internal.h"
#include "model/model.h" /* n_dspark_targets, hc_mult, dim: the width of the exported target features */
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

int sched_spec_make(dsv4_sched *s, const request *q, slot_spec *sp) {
    dsv4_error err;
    memset(sp, 0, sizeof *sp);
    if (q->spec.make(q->spec.ctx, s->m, &q->sampling, &sp->dr, &err)) {
        memset(&sp->dr, 0, sizeof sp->dr);
        return -1;
    }
    if (!sp->dr.propose) { dsv4_drafter_free(&sp->dr); return -1; }
    sp->synced = 1;   /* fresh, or loaded at the forked position (admit) */
    return 0;
}

void sched_spec_release(slot_spec *sp) {
    dsv4_drafter_free(&sp->dr);
    dsv4_seq_snapshot_free(sp->snap);
    free(sp->d.chunk);
    free(sp->d.probs);
    free(sp->d.conf);
    free(sp->d.cpos);
    free(sp->hidden);
    memset(sp, 0, sizeof *sp);
}

int sched_spec_alloc(dsv4_sched *s, slot *sl, const request *q) {
    slot_spec *sp = &sl->sp;
    const size_t V = (size_t)s->vocab, K = (size_t)q->spec.draft;
    if (!s->spec_scratch && !(s->spec_scratch = malloc(sizeof(float) * 2 * V))) return -1;
    /* the slot's logits grow to every row of [anchor, drafts]; kept for the slot's next streams */
    if (sl->logits_rows < (int)K + 1) {
        float *nl = realloc(sl->logits, sizeof(float) * (K + 1) * V);
        if (!nl) return -1;
        sl->logits = nl;
        sl->logits_rows = (int)K + 1;
    }
    sp->d.chunk = malloc(sizeof(int32_t) * (K + 2));
    sp->d.probs = malloc(sizeof(float) * K * V);
    sp->d.conf = malloc(sizeof(float) * K);
    if (!sp->d.chunk || !sp->d.probs || !sp->d.conf) return -1;
    if (sl->cs && !(sp->d.cpos = malloc(sizeof(dsv4_cpos) * (K + 1)))) return -1;
    if (sp->dr.hidden_dim > 0) {
        const dsv4_model *m = s->m;
        const int exported = sp->dr.dspark_features ? m->cfg.n_dspark_targets * m->cfg.dim : m->cfg.hc_mult * m->cfg.dim;
        if (sp->dr.hidden_dim != exported) return -1;
        /* prompt chunks go through the same buffer: DSV4_SPEC_PREFILL_CHUNK rows at a time */
        sp->hidden_rows = (int)K + 1 > DSV4_SPEC_PREFILL_CHUNK ? (int)K + 1 : DSV4_SPEC_PREFILL_CHUNK;
        if (!(sp->hidden = malloc(sizeof(float) * (size_t)sp->hidden_rows * (size_t)sp->dr.hidden_dim))) return -1;
    }
    dsv4_spec_rng_seed(sp->rng, q->sampling.seed);
    return 0;
}

int sched_spec_add_item(dsv4_sched *s, int *n_items, int slot_i, long long budget) {
    slot *sl = &s->slots[slot_i];
    slot_spec *sp = &sl->sp;
    const int64_t id = sl->req;
    const request *q = sched_req(s, id);
    const int64_t pos = dsv4_seq_position(sl->seq);
    /* drafts: at most spec.draft, what the budget leaves beside the anchor, one less than the tokens still
     * allowed (the bonus is one more), and no position past the model's last */
    long long max_k = q->spec.draft;
    if (budget - 1 < max_k) max_k = budget - 1;
    if (q->max_new - q->n_out - 1 < max_k) max_k = q->max_new - q->n_out - 1;
    if (s->max_pos - pos - 1 < max_k) max_k = s->max_pos - pos - 1;
    if (max_k < 0) max_k = 0;
    dsv4_seq_snapshot_free(sp->snap);
    sp->snap = NULL;
    if (dsv4_spec_draft(&sp->dr, &sl->smp, sl->cs, sl->seq, sl->pending, (int)max_k, q->spec.conf_threshold, s->vocab,
                        &sp->d, NULL) ||
        dsv4_seq_snapshot_new(sl->seq, &sp->snap, NULL)) {
        sched_finish(s, id, DSV4_FINISH_ERROR);
        return -1;
    }
    const int n = 1 + sp->d.k;
    s->items[*n_items] = (dsv4_step_item){ sl->seq, sp->d.chunk, n, DSV4_LOGITS_ALL, sl->logits, NULL, NULL };
    if (sp->hidden) {
        if (sp->dr.dspark_features) s->items[*n_items].features = sp->hidden;
        else s->items[*n_items].hidden = sp->hidden;
    }
    s->item_slot[*n_items] = slot_i;
    (*n_items)++;
    return n;
}

void sched_spec_prompt_rows(dsv4_sched *s, int slot_i, int64_t p0, int len) {
    slot *sl = &s->slots[slot_i];
    const request *q = sched_req(s, sl->req);
    if (!sl->sp.dr.on_commit || len <= 0) return;
    /* rows p0..p0+len-1 of the prompt; the token after row r is prompt[r + 1] (the last prompt token, the
     * anchor, is never a row here) */
    const dsv4_spec_verify_info vi = { p0, len, len, s->vocab, NULL, sl->sp.hidden, sl->sp.hidden ? sl->sp.dr.hidden_dim : 0 };
    if (sl->sp.dr.on_commit(sl->sp.dr.ctx, q->prompt + p0 + 1, len, &vi, NULL)) sched_finish(s, sl->req, DSV4_FINISH_ERROR);
}

void sched_spec_commit(dsv4_sched *s, int slot_i) {
    slot *sl = &s->slots[slot_i];
    slot_spec *sp = &sl->sp;
    const int64_t id = sl->req;
    request *q = sched_req(s, id);
    const int V = s->vocab, k = sp->d.k;
    const int64_t pos0 = dsv4_seq_position(sl->seq) - (k + 1);
    q->n_prompt_done = q->n_prompt; /* the first step's anchor was the last prompt token */
    /* the hook sees row j with the drafts before it as generated: out has room for k + 1 more tokens */
    if (q->hook.fn) {
        memcpy(q->out + q->n_out, sp->d.chunk + 1, sizeof(int32_t) * (size_t)k);
        for (int j = 0; j <= k; j++)
            if (q->hook.fn(q->hook.ctx, q->out, q->n_out + j, sl->logits + (size_t)j * V, V)) {
                sched_finish(s, id, DSV4_FINISH_ERROR);
                return;
            }
    }
    if (dsv4_spec_mask_rows(sl->cs, &sp->d, sl->logits, V, NULL)) { sched_finish(s, id, DSV4_FINISH_ERROR); return; }
    int32_t bonus;
    const int n_acc = dsv4_spec_verify_rows(&sl->smp, sl->logits, sp->d.chunk + 1, k, sp->d.probs_given ? sp->d.probs : NULL,
                                            sp->rng, s->spec_scratch, &bonus);
    /* the committed tokens c_0..c_{n_acc}: the accepted drafts, then the bonus (over chunk[1..]) */
    int32_t *c = sp->d.chunk + 1;
    c[n_acc] = bonus;
    /* take them one by one through the finish rules of take_token; the first that finishes ends the list */
    const int n_out0 = q->n_out;
    dsv4_finish why = DSV4_FINISH_NONE;
    int t = 0;
    while (t <= n_acc && why == DSV4_FINISH_NONE) {
        const int32_t tok = c[t];
        int cut_short = 0;
        if (sl->cs && tok == s->eos) {
            /* c_t was drawn from row t, masked at cpos[t] (t <= n_valid: verification never passes a refused draft) */
            dsv4_cstate_set(sl->cs, sp->d.cpos[t]);
            cut_short = !dsv4_cstate_complete(sl->cs);
        }
        q->out[q->n_out++] = tok;
        t++;
        if (cut_short) why = DSV4_FINISH_LENGTH;
        else if ((q->stop_on_eos || sl->cs) && tok == s->eos) why = DSV4_FINISH_EOS;
        else if (sched_ends_with_stop(q)) why = DSV4_FINISH_STOP;
        else if (q->n_out >= q->max_new) why = DSV4_FINISH_LENGTH;
    }
    /* the constraint follows the committed output: the drafts' positions are known, the last token advances */
    if (sl->cs) {
        dsv4_cstate_set(sl->cs, sp->d.cpos[t - 1]);
        if (dsv4_cstate_advance(sl->cs, c[t - 1], NULL)) { sched_finish(s, id, DSV4_FINISH_ERROR); return; }
    }
    /* keep the anchor and c_0..c_{t-2}; c_{t-1} is the new pending token (or the output's last one) */
    if (dsv4_seq_rollback(sl->seq, sp->snap, t, NULL)) { sched_finish(s, id, DSV4_FINISH_ERROR); return; }
    sl->pending = c[t - 1];
    q->spec_steps++;
    q->spec_drafted += k;
    q->spec_accepted += n_acc < t ? n_acc : t; /* a stop among the accepted drafts ends the output early */
    if (s->on_token)
        for (int i = 0; i < t; i++) s->on_token(s->on_token_ctx, id, n_out0 + i, c[i], sl->logits + (size_t)i * V);
    /* the drafter takes the committed rows; a stream that ends does so only when its final state goes to the
     * prefix cache with the drafter's (the next turn of the conversation resumes from both) */
    const int ends = why != DSV4_FINISH_NONE;
    if (sp->dr.on_commit && (!ends || (s->pcache && sp->dr.prefix_save))) {
        const dsv4_spec_verify_info vi = { pos0, k + 1, t, V, sl->logits, sp->hidden, sp->hidden ? sp->dr.hidden_dim : 0 };
        if (sp->dr.on_commit(sp->dr.ctx, c, t, &vi, NULL)) {
            if (!ends) { sched_finish(s, id, DSV4_FINISH_ERROR); return; }
            sp->synced = 0;   /* the output stands; only the drafter's state is not stored */
        }
    } else if (ends) {
        sp->synced = 0;
    }
    if (ends) sched_finish(s, id, why);
}
