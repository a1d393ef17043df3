/* Continuous-batching scheduler: see scheduler.h for the contract. */
#include "engine/sched_internal.h"
#include "model/model.h" /* max_spec: the most drafts a step may roll back */
#include "state/prefix_companion.h"
#include "util/error.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Matchers kept for requests that give a grammar: unpinned ones are dropped past these (constraint_cache.h). */
#define MCACHE_ENTRIES 32
#define MCACHE_BYTES ((size_t)512 << 20)

const char *dsv4_finish_name(dsv4_finish f) {
    switch (f) {
    case DSV4_FINISH_NONE: return "none";
    case DSV4_FINISH_EOS: return "eos";
    case DSV4_FINISH_LENGTH: return "length";
    case DSV4_FINISH_STOP: return "stop";
    case DSV4_FINISH_CANCELLED: return "cancelled";
    case DSV4_FINISH_CONTEXT: return "context";
    case DSV4_FINISH_ERROR: return "error";
    }
    return "?";
}

/* ---- lifetime ------------------------------------------------------------------------------------------ */

int dsv4_sched_new(dsv4_model *m, const dsv4_sched_opts *o, dsv4_sched **out, dsv4_error *err) {
    *out = NULL;
    if (!m || !o) return dsv4_fail(err, DSV4_E_ARG, "scheduler: no model or options");
    if (o->max_streams < 1 || o->max_streams > (1 << 20))
        return dsv4_fail(err, DSV4_E_ARG, "scheduler: max_streams must be 1..%d, got %d", 1 << 20, o->max_streams);
    if (o->step_tokens < 0) return dsv4_fail(err, DSV4_E_ARG, "scheduler: step_tokens must be >= 0 (0 = unlimited)");
    dsv4_sched *s = calloc(1, sizeof *s);
    if (!s) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    s->m = m;
    s->o = *o;
    s->observer_logits = 1;
    s->vocab = info.vocab_size;
    s->eos = info.eos_id;
    s->max_pos = info.max_position;
    const size_t n = (size_t)o->max_streams;
    s->slots = calloc(n, sizeof *s->slots);
    s->items = calloc(n, sizeof *s->items);
    s->item_slot = calloc(n, sizeof *s->item_slot);
    s->prefill_order = calloc(n, sizeof *s->prefill_order);
    if (!s->slots || !s->items || !s->item_slot || !s->prefill_order) goto nomem;
    if (dsv4_cmcache_new(MCACHE_BYTES, MCACHE_ENTRIES, &s->mcache, NULL)) goto nomem;
    for (size_t i = 0; i < n; i++) {
        s->slots[i].req = -1;
        s->slots[i].logits = malloc(sizeof(float) * (size_t)s->vocab);
        if (!s->slots[i].logits) goto nomem;
        s->slots[i].logits_rows = 1;
    }
    *out = s;
    return 0;
nomem:
    dsv4_sched_free(s);
    return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
}

static void request_free_memory(request *r) {
    free(r->prompt);
    free(r->stop_tok);
    free(r->stop_len);
    free(r->out);
    r->prompt = r->stop_tok = r->out = NULL;
    r->stop_len = NULL;
}

/* Free a slot's sequence state and sampler at once; the request keeps its result. */
static void slot_release(dsv4_sched *s, int i) {
    slot *sl = &s->slots[i];
    if (sl->req < 0) return;
    dsv4_seq_free(sl->seq);
    dsv4_sampler_free(&sl->smp);
    dsv4_cstate_free(sl->cs);
    dsv4_cmcache_release(s->mcache, sl->cm);
    sched_spec_release(&sl->sp);
    sl->seq = NULL;
    sl->cs = NULL;
    sl->cm = NULL;
    sl->req = -1;
    s->n_running--;
}

void dsv4_sched_free(dsv4_sched *s) {
    if (!s) return;
    if (s->slots)
        for (int i = 0; i < s->o.max_streams; i++) {
            slot_release(s, i);
            free(s->slots[i].logits);
        }
    for (int64_t i = 0; i < s->n_req - s->base; i++) request_free_memory(&s->req[i]);
    free(s->req);
    free(s->slots);
    free(s->items);
    free(s->item_slot);
    free(s->prefill_order);
    free(s->spec_scratch);
    dsv4_cmcache_free(s->mcache);
    free(s);
}

void dsv4_sched_set_observer(dsv4_sched *s, dsv4_sched_token_fn fn, void *ctx) {
    s->on_token = fn;
    s->on_token_ctx = ctx;
}

void dsv4_sched_observer_needs_logits(dsv4_sched *s, int needed) { s->observer_logits = !!needed; }

/* ---- requests ------------------------------------------------------------------------------------------ */

static int validate_request(const dsv4_sched *s, const dsv4_request *r, dsv4_error *err) {
    if (!r || !r->prompt || r->n_prompt < 1) return dsv4_fail(err, DSV4_E_ARG, "a request needs at least one prompt token");
    if (r->n_prompt > s->max_pos)
        return dsv4_fail(err, DSV4_E_RANGE, "prompt of %d tokens exceeds the model's maximum of %lld positions",
                         r->n_prompt, (long long)s->max_pos);
    for (int k = 0; k < r->n_prompt; k++)
        if (r->prompt[k] < 0 || r->prompt[k] >= s->vocab)
            return dsv4_fail(err, DSV4_E_ARG, "prompt token %d at index %d is outside the vocabulary (0..%d)",
                             r->prompt[k], k, s->vocab - 1);
    if (r->max_new_tokens < 0) return dsv4_fail(err, DSV4_E_ARG, "max_new_tokens must be >= 0");
    if (r->n_stop < 0 || (r->n_stop > 0 && !r->stop)) return dsv4_fail(err, DSV4_E_ARG, "bad stop sequence list");
    for (int i = 0; i < r->n_stop; i++)
        if (r->stop[i].n < 1 || !r->stop[i].tokens) return dsv4_fail(err, DSV4_E_ARG, "stop sequence %d is empty", i);
    if (r->spec.make) {
        const int max_draft = s->m->max_spec - 1;
        if (r->spec.draft < 1 || r->spec.draft > max_draft)
            return dsv4_fail(err, DSV4_E_ARG, "speculation: %d drafts per step is outside 1..%d (the model was loaded with "
                             "max_spec = %d ring slots; the anchor takes one)", r->spec.draft, max_draft, s->m->max_spec);
        if (!(r->spec.conf_threshold >= 0.0f && r->spec.conf_threshold <= 1.0f))
            return dsv4_fail(err, DSV4_E_ARG, "speculation: the confidence threshold must be in [0, 1]");
    }
    if (!r->matcher && !r->grammar != !r->cvocab)
        return dsv4_fail(err, DSV4_E_ARG, "a constrained request needs both a grammar and a vocabulary (or a matcher)");
    const dsv4_cvocab *cv = r->matcher ? dsv4_cmatcher_vocab(r->matcher) : r->cvocab;
    if (cv && dsv4_cvocab_size(cv) != s->vocab)
        return dsv4_fail(err, DSV4_E_ARG, "the constraint's vocabulary has %d tokens, the model %d", dsv4_cvocab_size(cv), s->vocab);
    if (cv && dsv4_cvocab_eos(cv) != s->eos)
        return dsv4_fail(err, DSV4_E_ARG, "the constraint's end-of-sequence token %d is not the model's (%d)", dsv4_cvocab_eos(cv), s->eos);
    /* the sampler checks its own parameters; try them now so that admission cannot fail on them later */
    dsv4_sampler probe;
    int rc = dsv4_sampler_init(&probe, &r->sampling, s->vocab, err);
    dsv4_sampler_free(&probe);
    return rc;
}

/* Deep-copy the caller's request into a record. */
static int request_copy(request *dst, const dsv4_request *r) {
    memset(dst, 0, sizeof *dst);
    dst->slot = -1;
    dst->n_prompt = r->n_prompt;
    dst->sampling = r->sampling;
    dst->max_new = r->max_new_tokens;
    dst->stop_on_eos = r->stop_on_eos;
    dst->grammar = r->grammar;
    dst->cvocab = r->cvocab;
    dst->matcher = r->matcher;
    dst->hook = r->hook;
    dst->spec = r->spec;
    dst->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
    if (!dst->prompt) return -1;
    memcpy(dst->prompt, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    if (r->n_stop > 0) {
        size_t total = 0;
        for (int i = 0; i < r->n_stop; i++) total += (size_t)r->stop[i].n;
        dst->stop_tok = malloc(sizeof(int32_t) * total);
        dst->stop_len = malloc(sizeof(int) * (size_t)r->n_stop);
        if (!dst->stop_tok || !dst->stop_len) { request_free_memory(dst); return -1; }
        size_t at = 0;
        for (int i = 0; i < r->n_stop; i++) {
            memcpy(dst->stop_tok + at, r->stop[i].tokens, sizeof(int32_t) * (size_t)r->stop[i].n);
            dst->stop_len[i] = r->stop[i].n;
            at += (size_t)r->stop[i].n;
        }
        dst->n_stop = r->n_stop;
    }
    return 0;
}

int dsv4_sched_add(dsv4_sched *s, const dsv4_request *r, int64_t *id, dsv4_error *err) {
    int rc = validate_request(s, r, err);
    if (rc) return rc;
    if (s->n_req - s->base == s->cap_req) {
        const int64_t cap = s->cap_req ? 2 * s->cap_req : 16;
        request *nr = realloc(s->req, sizeof *nr * (size_t)cap);
        if (!nr) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        s->req = nr;
        s->cap_req = cap;
    }
    request *q = &s->req[s->n_req - s->base];
    if (request_copy(q, r)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (q->max_new == 0) {
        q->state = DSV4_REQ_DONE;
        q->finish = DSV4_FINISH_LENGTH;
    } else {
        q->state = DSV4_REQ_WAITING;
        s->n_pending++;
    }
    if (id) *id = s->n_req;
    s->n_req++;
    return 0;
}

static request *find(const dsv4_sched *s, int64_t id, dsv4_error *err) {
    if (id < s->base || id >= s->n_req || s->req[id - s->base].released) {
        dsv4_fail(err, DSV4_E_ARG, "unknown request id %lld", (long long)id);
        return NULL;
    }
    return &s->req[id - s->base];
}

void sched_finish(dsv4_sched *s, int64_t id, dsv4_finish why) {
    request *q = &s->req[id - s->base];
    if (q->state == DSV4_REQ_DONE) return;
    /* a stream that ended normally leaves its state for the conversation's next turn (a failed put only
     * loses reuse, never correctness) */
    if (q->slot >= 0 && s->pcache && (why == DSV4_FINISH_EOS || why == DSV4_FINISH_STOP || why == DSV4_FINISH_LENGTH))
        sched_cache_put(s, q->slot);
    if (q->slot >= 0) slot_release(s, q->slot);
    q->slot = -1;
    q->state = DSV4_REQ_DONE;
    q->finish = why;
    s->n_pending--;
}

int dsv4_sched_cancel(dsv4_sched *s, int64_t id, dsv4_error *err) {
    if (!find(s, id, err)) return err ? err->code : DSV4_E_ARG;
    sched_finish(s, id, DSV4_FINISH_CANCELLED);
    return 0;
}

int dsv4_sched_result(const dsv4_sched *s, int64_t id, dsv4_req_result *out, dsv4_error *err) {
    const request *q = find(s, id, err);
    if (!q) return err ? err->code : DSV4_E_ARG;
    out->state = q->state;
    out->finish = q->finish;
    out->tokens = q->out;
    out->n_tokens = q->n_out;
    out->n_prompt_done = q->n_prompt_done;
    out->n_cached = q->n_cached;
    out->spec_steps = q->spec_steps;
    out->spec_drafted = q->spec_drafted;
    out->spec_accepted = q->spec_accepted;
    return 0;
}

int dsv4_sched_release(dsv4_sched *s, int64_t id, dsv4_error *err) {
    request *q = find(s, id, err);
    if (!q) return err ? err->code : DSV4_E_ARG;
    if (q->state != DSV4_REQ_DONE) return dsv4_fail(err, DSV4_E_ARG, "request %lld is not finished", (long long)id);
    request_free_memory(q);
    q->released = 1;
    /* drop the released records at the front (only those admission has passed) once they are half the array */
    int64_t k = 0;
    const int64_t live = s->n_req - s->base;
    while (k < live && s->base + k < s->wait_head && s->req[k].released) k++;
    if (k >= 64 && 2 * k >= live) {
        memmove(s->req, s->req + k, sizeof *s->req * (size_t)(live - k));
        s->base += k;
    }
    return 0;
}

void dsv4_sched_set_prefix_cache(dsv4_sched *s, dsv4_prefix_cache *c) { s->pcache = c; }

void sched_cache_put(dsv4_sched *s, int slot_i) {
    slot *sl = &s->slots[slot_i];
    prefix_companion *comp = NULL;
    /* a drafter that has taken every committed row stores its state with the entry; when it cannot, the entry is
     * still good for streams that need no drafter state (a failed put only loses reuse, never correctness) */
    if (sched_speculates(sl) && sl->sp.dr.prefix_save && sl->sp.synced && sl->sp.dr.prefix_save(sl->sp.dr.ctx, &comp, NULL))
        comp = NULL;
    (void)prefix_cache_put_with(s->pcache, sl->seq, comp, NULL);
}

size_t dsv4_sched_state_bytes(const dsv4_sched *s) {
    size_t total = 0;
    for (int i = 0; i < s->o.max_streams; i++)
        if (s->slots[i].req >= 0 && s->slots[i].seq) total += dsv4_seq_state_bytes(s->slots[i].seq);
    return total;
}

int dsv4_sched_pending(const dsv4_sched *s) { return (int)s->n_pending; }
int dsv4_sched_running(const dsv4_sched *s) { return s->n_running; }
int dsv4_sched_last_step_tokens(const dsv4_sched *s) { return s->last_T; }

/* ---- one step ------------------------------------------------------------------------------------------ */

/* Give free slots to waiting requests, oldest first. A request whose state cannot be allocated finishes as
 * ERROR rather than blocking the queue. */
static void admit(dsv4_sched *s) {
    for (int i = 0; i < s->o.max_streams && s->wait_head < s->n_req; i++) {
        slot *sl = &s->slots[i];
        if (sl->req >= 0) continue;
        while (s->wait_head < s->n_req && s->req[s->wait_head - s->base].state != DSV4_REQ_WAITING) s->wait_head++;
        if (s->wait_head == s->n_req) break;
        const int64_t id = s->wait_head++;
        request *q = sched_req(s, id);
        /* the slot holds the request from here on: a failure below finishes it as ERROR, which frees whatever
         * was made (slot_release) */
        sl->seq = NULL;
        sl->cs = NULL;
        sl->cm = NULL;
        memset(&sl->smp, 0, sizeof sl->smp);
        memset(&sl->sp, 0, sizeof sl->sp);
        sl->req = id;
        q->slot = i;
        q->state = DSV4_REQ_RUNNING;
        s->n_running++;
        if (q->spec.make && sched_spec_make(s, q, &sl->sp)) { sched_finish(s, id, DSV4_FINISH_ERROR); continue; }
        /* a drafter fed from target features needs every prompt row: it forks only from entries that carry its
         * state (sched_cache_put), and without prefix_save/load not at all */
        const dsv4_drafter *dr = &sl->sp.dr;
        const int needs_rows = sched_speculates(sl) && dr->hidden_dim > 0;
        const int use_cache = s->pcache && (!needs_rows || (dr->prefix_save && dr->prefix_load));
        int64_t matched = 0;
        const prefix_companion *comp = NULL;
        const int fail = use_cache ? prefix_cache_lookup_with(s->pcache, s->m, q->prompt, q->n_prompt - 1, needs_rows ? dr->name : NULL,
                                                              needs_rows ? dr->prefix_codec : NULL, &sl->seq, &matched, &comp, NULL)
                                   : dsv4_seq_new(s->m, &sl->seq, NULL);
        if (fail) { sl->seq = NULL; sched_finish(s, id, DSV4_FINISH_ERROR); continue; }
        /* the drafter resumes at the forked position, with the prompt's token there (the anchor when matched is
         * the whole prompt but the last token) */
        if (comp && dr->prefix_load(dr->ctx, comp, q->prompt[matched], NULL)) { sched_finish(s, id, DSV4_FINISH_ERROR); continue; }
        q->n_prompt_done = q->n_cached = matched;
        if (dsv4_sampler_init(&sl->smp, &q->sampling, s->vocab, NULL)) { sched_finish(s, id, DSV4_FINISH_ERROR); continue; }
        const int64_t bound = (int64_t)q->max_new - 1;
        /* a grammar's matcher comes from the cache: the second request with a schema finds its masks warm */
        if (!q->matcher && q->grammar && dsv4_cmcache_get(s->mcache, q->grammar, q->cvocab, &sl->cm, NULL)) {
            sl->cm = NULL;
            sched_finish(s, id, DSV4_FINISH_ERROR);
            continue;
        }
        if ((q->matcher || sl->cm) && dsv4_cstate_new_shared(q->matcher ? q->matcher : sl->cm, bound, &sl->cs, NULL)) {
            sl->cs = NULL;
            sched_finish(s, id, DSV4_FINISH_ERROR);
            continue;
        }
        if (sched_speculates(sl) && sched_spec_alloc(s, sl, q)) { sched_finish(s, id, DSV4_FINISH_ERROR); continue; }
        sl->pending = q->prompt[q->n_prompt - 1]; /* a speculating stream's first anchor: its last prompt token */
    }
}

/* Prompt tokens a stream processes before it decodes: all of them, or all but the last for a speculating
 * stream (the last one is the anchor of its first speculative step). */
static int64_t prefill_end(const slot *sl, const request *q) { return q->n_prompt - (sched_speculates(sl) ? 1 : 0); }

static int is_decoding(const dsv4_sched *s, const slot *sl) {
    return sl->req >= 0 && sched_req(s, sl->req)->n_prompt_done >= prefill_end(sl, sched_req(s, sl->req));
}

/* A decoding stream at the model's last position cannot take another token: it finishes as CONTEXT. */
static void retire_at_context_limit(dsv4_sched *s) {
    for (int i = 0; i < s->o.max_streams; i++) {
        slot *sl = &s->slots[i];
        if (is_decoding(s, sl) && dsv4_seq_position(sl->seq) + 1 > s->max_pos) sched_finish(s, sl->req, DSV4_FINISH_CONTEXT);
    }
}

/* An item of the step; `samples`: the stream draws a token from its last row. A stream with no logits hook and no
 * constraint draws it inside the step (on the model's device: dsv4_step_item.sample, the same token as
 * dsv4_sample on that row), and its row comes back only for an observer that reads it. */
static void add_item(dsv4_sched *s, int *n_items, int slot_i, const int32_t *tokens, int n, int samples) {
    slot *sl = &s->slots[slot_i];
    const request *q = sched_req(s, sl->req);
    /* a speculating stream keeps its rows on the host: its drafter and its verification read them */
    sl->in_step = samples && !q->hook.fn && !sl->cs && !sched_speculates(sl);
    const int rows = samples && (!sl->in_step || (s->on_token && s->observer_logits));
    dsv4_step_item *it = &s->items[*n_items];
    *it = (dsv4_step_item){ sl->seq, tokens, n, rows ? DSV4_LOGITS_LAST : DSV4_LOGITS_NONE, rows ? sl->logits : NULL };
    if (sl->in_step) {
        it->sample = &sl->smp.params;
        it->draw = sl->smp.counter;
        it->token = &sl->drawn;
    }
    s->item_slot[*n_items] = slot_i;
    (*n_items)++;
}

static int item_samples(const dsv4_step_item *it) { return it->want != DSV4_LOGITS_NONE || it->sample; }

/* Decode tokens first (one per decoding stream, starting at a rotating slot so that a budget smaller than
 * the number of streams is shared fairly), then prompt chunks, oldest request first. Returns the items. */
static int build_step(dsv4_sched *s, int *T_out) {
    int n_items = 0;
    long long budget = s->o.step_tokens > 0 ? s->o.step_tokens : LLONG_MAX;
    const int S = s->o.max_streams;
    for (int k = 0; k < S && budget > 0; k++) {
        const int i = (s->rr + k) % S;
        if (!is_decoding(s, &s->slots[i])) continue;
        if (sched_speculates(&s->slots[i])) {
            const int used = sched_spec_add_item(s, &n_items, i, budget);
            if (used > 0) budget -= used;
            continue;
        }
        add_item(s, &n_items, i, &s->slots[i].pending, 1, 1);
        budget--;
    }
    s->rr = (s->rr + 1) % S;
    int n_pre = 0;
    for (int i = 0; i < S; i++) {
        if (s->slots[i].req < 0 || is_decoding(s, &s->slots[i])) continue;
        int j = n_pre++;
        while (j > 0 && s->slots[s->prefill_order[j - 1]].req > s->slots[i].req) {
            s->prefill_order[j] = s->prefill_order[j - 1];
            j--;
        }
        s->prefill_order[j] = i;
    }
    for (int k = 0; k < n_pre && budget > 0; k++) {
        const int i = s->prefill_order[k];
        slot *sl = &s->slots[i];
        const request *q = sched_req(s, sl->req);
        int64_t left = prefill_end(sl, q) - q->n_prompt_done;
        /* with a prefix cache the prompt stops one token short once, so that state can be stored (a
         * speculating stream's prompt stops there anyway) */
        if (s->pcache && !sched_speculates(sl) && q->n_prompt_done < q->n_prompt - 1) left--;
        /* the drafter's target features of the chunk's rows go through a buffer of hidden_rows rows */
        if (sl->sp.hidden && left > sl->sp.hidden_rows) left = sl->sp.hidden_rows;
        const int n = (int)(left < budget ? left : budget);
        const int completes = q->n_prompt_done + n == q->n_prompt;
        add_item(s, &n_items, i, q->prompt + q->n_prompt_done, n, completes);
        if (sl->sp.hidden) {
            if (sl->sp.dr.dspark_features) s->items[n_items - 1].features = sl->sp.hidden;
            else s->items[n_items - 1].hidden = sl->sp.hidden;
        }
        budget -= n;
    }
    long long T = 0;
    for (int k = 0; k < n_items; k++) T += s->items[k].n_tokens;
    *T_out = (int)T;
    return n_items;
}

/* Room for one more output token for every item that samples, before the step, so that nothing after the
 * step can fail. */
static int reserve_outputs(dsv4_sched *s, int n_items) {
    for (int k = 0; k < n_items; k++) {
        if (!item_samples(&s->items[k])) continue;
        request *q = sched_req(s, s->slots[s->item_slot[k]].req);
        /* a speculative item may emit every one of its tokens (accepted drafts and the bonus) */
        const int need = s->items[k].want == DSV4_LOGITS_ALL ? s->items[k].n_tokens : 1;
        if (q->n_out + need <= q->out_cap) continue;
        int cap = q->out_cap ? 2 * q->out_cap : 16;
        while (cap < q->n_out + need) cap *= 2;
        int32_t *no = realloc(q->out, sizeof(int32_t) * (size_t)cap);
        if (!no) return -1;
        q->out = no;
        q->out_cap = cap;
    }
    return 0;
}

int sched_ends_with_stop(const request *q) {
    const int32_t *st = q->stop_tok;
    for (int i = 0; i < q->n_stop; st += q->stop_len[i], i++) {
        const int n = q->stop_len[i];
        if (q->n_out >= n && !memcmp(q->out + q->n_out - n, st, sizeof(int32_t) * (size_t)n)) return 1;
    }
    return 0;
}

/* Sample one token for a stream whose logits came back, record it, and retire the stream if it stops. */
static void take_token(dsv4_sched *s, int slot_i) {
    slot *sl = &s->slots[slot_i];
    const int64_t id = sl->req;
    request *q = &s->req[id - s->base];
    const float *row = sl->logits;
    int32_t tok;
    if (sl->in_step) {
        /* drawn by the step (draw number smp.counter, as dsv4_sample would have) */
        tok = sl->drawn;
        sl->smp.counter++;
        if (!(s->on_token && s->observer_logits)) row = NULL;
    } else {
        if (q->hook.fn && q->hook.fn(q->hook.ctx, q->out, q->n_out, sl->logits, s->vocab)) {
            sched_finish(s, id, DSV4_FINISH_ERROR);
            return;
        }
        /* constrained: disallowed tokens get -inf before temperature and filters (after the hook, so that
         * nothing re-allows them); the state follows the token */
        if (sl->cs && dsv4_cstate_mask(sl->cs, sl->logits, NULL)) { sched_finish(s, id, DSV4_FINISH_ERROR); return; }
        tok = dsv4_sample(&sl->smp, sl->logits);
    }
    /* EOS before the value is complete happens only when max_new_tokens is below the shortest value: the
     * budget ran out, which is what LENGTH says */
    const int cut_short = sl->cs && tok == s->eos && !dsv4_cstate_complete(sl->cs);
    if (sl->cs && dsv4_cstate_advance(sl->cs, tok, NULL)) { sched_finish(s, id, DSV4_FINISH_ERROR); return; }
    q->out[q->n_out++] = tok;
    sl->pending = tok;
    if (s->on_token) s->on_token(s->on_token_ctx, id, q->n_out - 1, tok, row);
    if (cut_short) sched_finish(s, id, DSV4_FINISH_LENGTH);
    else if ((q->stop_on_eos || sl->cs) && tok == s->eos) sched_finish(s, id, DSV4_FINISH_EOS);
    else if (sched_ends_with_stop(q)) sched_finish(s, id, DSV4_FINISH_STOP);
    else if (q->n_out >= q->max_new) sched_finish(s, id, DSV4_FINISH_LENGTH);
}

int dsv4_sched_step(dsv4_sched *s, dsv4_error *err) {
    s->last_T = 0;
    retire_at_context_limit(s);
    admit(s);
    int T = 0;
    const int n_items = build_step(s, &T);
    if (n_items == 0) return 0;
    if (reserve_outputs(s, n_items)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory for generated tokens");
    int rc = dsv4_step(s->m, s->items, n_items, err);
    if (rc) return rc;
    s->last_T = T;
    for (int k = 0; k < n_items; k++) {
        const int i = s->item_slot[k];
        if (s->slots[i].req < 0) continue;
        request *q = sched_req(s, s->slots[i].req);
        /* a speculating stream's decode item: verification, rollback, 1..k+1 tokens */
        if (s->items[k].want == DSV4_LOGITS_ALL) { sched_spec_commit(s, i); continue; }
        if (q->n_prompt_done < q->n_prompt) {
            const int64_t p0 = q->n_prompt_done;
            q->n_prompt_done += s->items[k].n_tokens;
            /* the drafter takes the chunk's rows first: the stored state carries the drafter's (sched_cache_put) */
            if (sched_speculates(&s->slots[i])) sched_spec_prompt_rows(s, i, p0, s->items[k].n_tokens);
            if (s->slots[i].req < 0) continue;   /* the drafter failed: finished as ERROR */
            if (s->pcache && q->n_prompt_done == q->n_prompt - 1) sched_cache_put(s, i);
        }
        if (item_samples(&s->items[k])) take_token(s, i);
    }
    admit(s);
    return 0;
}
