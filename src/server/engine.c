/* The engine thread: see engine.h. */
#include "server/engine.h"
#include "util/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct server_job {
    /* the request (immutable after server_job_new) */
    int32_t *prompt;
    int n_prompt;
    dsv4_sampling sampling;
    int max_new, stop_on_eos;
    int32_t stop_ids[4];
    int n_stop_ids;
    server_logits_proc proc;      /* the scheduler hook's context: lives as long as the job */
    int want_logprobs, top_logprobs;
    server_waiter *waiter;
    dsv4_grammar *grammar;        /* owned: the scheduler borrows it while the job runs */
    const dsv4_cvocab *cvocab;
    /* engine thread only */
    int64_t sched_id;
    server_token *stage;          /* tokens of the current step, published after it */
    int n_stage, cap_stage;
    int cancel_sent;
    /* under the engine lock */
    server_token *toks;
    int n_toks, cap_toks;
    int done;
    dsv4_finish finish;
    int64_t cached;
    double t_first;
    int cancel;                   /* the HTTP side asked to stop */
    int refs;
};

struct server_engine {
    dsv4_model *m;
    dsv4_sched *sched;
    server_engine_opts o;
    int vocab;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t wake;          /* the engine waits here for work */
    server_job **incoming;        /* submitted, not yet in the scheduler */
    int n_in, cap_in;
    server_job **active;          /* in the scheduler (waiting or running there) */
    int n_act, cap_act;
    int outstanding;              /* submitted and not finished */
    int stopping;
    /* counters (under the lock) */
    int64_t steps, step_tokens, prompt_tokens, generated_tokens, cached_tokens;
    size_t state_bytes;
    int running;
    dsv4_prefix_cache_stats pcache_stats;   /* copied by the engine thread after each step */
};

double server_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int server_waiter_init(server_waiter *w) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&w->cond, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

void server_waiter_destroy(server_waiter *w) { pthread_cond_destroy(&w->cond); }

/* ---- jobs ------------------------------------------------------------------------------------------------ */

int server_job_new(const server_job_spec *spec, server_job **out) {
    *out = NULL;
    if (spec->n_stop_ids > 4 || spec->n_prompt < 1) { dsv4_grammar_free(spec->grammar); return DSV4_E_ARG; }
    server_job *j = calloc(1, sizeof *j);
    if (!j) { dsv4_grammar_free(spec->grammar); return DSV4_E_NOMEM; }
    j->grammar = spec->grammar;
    j->cvocab = spec->cvocab;
    j->prompt = malloc(sizeof(int32_t) * (size_t)spec->n_prompt);
    if (!j->prompt) { dsv4_grammar_free(j->grammar); free(j); return DSV4_E_NOMEM; }
    memcpy(j->prompt, spec->prompt, sizeof(int32_t) * (size_t)spec->n_prompt);
    j->n_prompt = spec->n_prompt;
    j->sampling = spec->sampling;
    j->max_new = spec->max_new;
    j->stop_on_eos = spec->stop_on_eos;
    if (spec->n_stop_ids) memcpy(j->stop_ids, spec->stop_ids, sizeof(int32_t) * (size_t)spec->n_stop_ids);
    j->n_stop_ids = spec->n_stop_ids;
    j->proc = spec->proc;
    j->proc.counts = NULL;
    j->want_logprobs = spec->want_logprobs;
    j->top_logprobs = spec->top_logprobs > SERVER_MAX_TOP_LOGPROBS ? SERVER_MAX_TOP_LOGPROBS : spec->top_logprobs;
    j->waiter = spec->waiter;
    j->sched_id = -1;
    j->refs = 1;
    *out = j;
    return 0;
}

static void job_free(server_job *j) {
    dsv4_grammar_free(j->grammar);
    free(j->prompt);
    free(j->stage);
    free(j->toks);
    server_logits_proc_free(&j->proc);
    free(j);
}

/* Drop one reference with the lock held. */
static void job_unref_locked(server_job *j) {
    if (--j->refs == 0) job_free(j);
}

void server_job_release(server_engine *e, server_job *j) {
    if (!j) return;
    if (!e) { job_unref_locked(j); return; }   /* never submitted: no other owner */
    pthread_mutex_lock(&e->mu);
    if (!j->done && !j->cancel) {
        j->cancel = 1;
        pthread_cond_signal(&e->wake);
    }
    j->waiter = NULL;          /* nobody reads any more */
    job_unref_locked(j);
    pthread_mutex_unlock(&e->mu);
}

int server_job_read(const server_job *j, int *have, server_token *out, int cap) {
    int n = 0;
    while (*have < j->n_toks && n < cap) out[n++] = j->toks[(*have)++];
    return n;
}

int server_job_done(const server_job *j) { return j->done; }
int server_job_n_tokens(const server_job *j) { return j->n_toks; }
dsv4_finish server_job_finish(const server_job *j) { return j->finish; }
int64_t server_job_cached(const server_job *j) { return j->cached; }
double server_job_first_token_s(const server_job *j) { return j->t_first; }

/* ---- lists ------------------------------------------------------------------------------------------------ */

static int push(server_job ***v, int *n, int *cap, server_job *j) {
    if (*n == *cap) {
        const int nc = *cap ? 2 * *cap : 64;
        server_job **nv = realloc(*v, sizeof *nv * (size_t)nc);
        if (!nv) return -1;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = j;
    return 0;
}

static void notify(server_job *j) {
    if (j->waiter) pthread_cond_broadcast(&j->waiter->cond);
}

/* A job leaves the engine: done, counted, its reader woken, the engine's reference dropped. Lock held. */
static void job_finish_locked(server_engine *e, server_job *j, dsv4_finish why) {
    j->done = 1;
    j->finish = why;
    e->outstanding--;
    notify(j);
    job_unref_locked(j);
}

/* ---- the observer: runs inside dsv4_sched_step (no lock); only engine-private fields are touched ---------- */

static server_job *find_active(server_engine *e, int64_t id) {
    for (int i = 0; i < e->n_act; i++)
        if (e->active[i]->sched_id == id) return e->active[i];
    return NULL;
}

static void on_token(void *ctx, int64_t id, int index, int32_t token, const float *logits) {
    server_engine *e = ctx;
    (void)index;
    server_job *j = find_active(e, id);
    if (!j) return;
    if (j->n_stage == j->cap_stage) {
        const int nc = j->cap_stage ? 2 * j->cap_stage : 4;
        server_token *ns = realloc(j->stage, sizeof *ns * (size_t)nc);
        if (!ns) return;   /* the token is lost to the reader; the scheduler's own copy decides finishing */
        j->stage = ns;
        j->cap_stage = nc;
    }
    server_token *t = &j->stage[j->n_stage++];
    t->id = token;
    t->n_top = 0;
    t->logprob = 0;
    if (j->want_logprobs) {
        t->logprob = server_logprobs(logits, e->vocab, token, j->top_logprobs, t->top);
        t->n_top = j->top_logprobs;
    }
}

/* ---- the loop ---------------------------------------------------------------------------------------------- */

/* Move submitted jobs into the scheduler. Lock held (dsv4_sched_add does no model work). */
static void admit_incoming(server_engine *e) {
    for (int i = 0; i < e->n_in; i++) {
        server_job *j = e->incoming[i];
        if (j->cancel) { job_finish_locked(e, j, DSV4_FINISH_CANCELLED); continue; }
        dsv4_stop_seq stops[4];
        for (int k = 0; k < j->n_stop_ids; k++) stops[k] = (dsv4_stop_seq){&j->stop_ids[k], 1};
        dsv4_request r = {.prompt = j->prompt, .n_prompt = j->n_prompt, .sampling = j->sampling, .max_new_tokens = j->max_new,
                          .stop_on_eos = j->stop_on_eos, .stop = stops, .n_stop = j->n_stop_ids,
                          .grammar = j->grammar, .cvocab = j->cvocab};
        /* undecodable ids are kept out by the draw itself (n_allowed), so a request without penalties or logprobs
         * needs no hook and draws inside the step (on the GPU for a cuda model: only ids come back); logprobs
         * keep the hook, so that they are computed from the masked row as before */
        if (j->proc.mask_from > 0 && (r.sampling.n_allowed <= 0 || r.sampling.n_allowed > j->proc.mask_from))
            r.sampling.n_allowed = j->proc.mask_from;
        if (j->proc.presence != 0.0f || j->proc.frequency != 0.0f || j->want_logprobs)
            r.hook = (dsv4_logits_hook){server_logits_apply, &j->proc};
        dsv4_error err;
        if (push(&e->active, &e->n_act, &e->cap_act, j) || dsv4_sched_add(e->sched, &r, &j->sched_id, &err)) {
            if (e->n_act && e->active[e->n_act - 1] == j) e->n_act--;
            job_finish_locked(e, j, DSV4_FINISH_ERROR);
        }
    }
    e->n_in = 0;
}

static void apply_cancels(server_engine *e) {
    for (int i = 0; i < e->n_act; i++) {
        server_job *j = e->active[i];
        if ((j->cancel || e->stopping) && !j->cancel_sent) {
            dsv4_sched_cancel(e->sched, j->sched_id, NULL);
            j->cancel_sent = 1;
        }
    }
}

/* After a step (or cancellations): hand staged tokens to readers, retire finished jobs. Lock held. */
static void publish(server_engine *e, double now) {
    int w = 0;
    for (int i = 0; i < e->n_act; i++) {
        server_job *j = e->active[i];
        if (j->n_stage) {
            if (j->n_toks + j->n_stage > j->cap_toks) {
                int nc = j->cap_toks ? j->cap_toks : 16;
                while (nc < j->n_toks + j->n_stage) nc *= 2;
                server_token *nt = realloc(j->toks, sizeof *nt * (size_t)nc);
                if (nt) { j->toks = nt; j->cap_toks = nc; }
            }
            if (j->n_toks + j->n_stage <= j->cap_toks) {
                memcpy(j->toks + j->n_toks, j->stage, sizeof *j->stage * (size_t)j->n_stage);
                if (!j->n_toks) j->t_first = now;
                j->n_toks += j->n_stage;
                e->generated_tokens += j->n_stage;
            }
            j->n_stage = 0;
            notify(j);
        }
        dsv4_req_result r = {0};
        if (dsv4_sched_result(e->sched, j->sched_id, &r, NULL) == 0 && r.state == DSV4_REQ_DONE) {
            j->cached = r.n_cached;
            e->cached_tokens += r.n_cached;
            dsv4_sched_release(e->sched, j->sched_id, NULL);
            job_finish_locked(e, j, r.finish);
            continue;
        }
        if (r.state == DSV4_REQ_RUNNING) j->cached = r.n_cached;
        e->active[w++] = j;
    }
    e->n_act = w;
}

static void *engine_main(void *arg) {
    server_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        admit_incoming(e);
        apply_cancels(e);
        publish(e, server_now_s());
        /* cancellations free state without a step: keep the gauges true while idle */
        e->running = dsv4_sched_running(e->sched);
        e->state_bytes = dsv4_sched_state_bytes(e->sched);
        if (e->stopping && e->n_act == 0) break;
        if (dsv4_sched_pending(e->sched) == 0) {
            pthread_cond_wait(&e->wake, &e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        dsv4_error err = {0};
        const int rc = dsv4_sched_step(e->sched, &err);
        const size_t bytes = dsv4_sched_state_bytes(e->sched);
        const int running = dsv4_sched_running(e->sched);
        const int T = dsv4_sched_last_step_tokens(e->sched);
        dsv4_prefix_cache_stats pcs = {0};
        if (e->o.pcache) dsv4_prefix_cache_get_stats(e->o.pcache, &pcs);
        pthread_mutex_lock(&e->mu);
        e->pcache_stats = pcs;
        e->state_bytes = bytes;
        e->running = running;
        if (rc) {
            /* a failed step (out of memory) would fail again: end every stream with an error */
            fprintf(stderr, "dsv4 serve: engine step failed: %s\n", err.msg);
            for (int i = 0; i < e->n_act; i++) e->active[i]->cancel = 1;
        } else {
            e->steps++;
            e->step_tokens += T;
        }
        publish(e, server_now_s());
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int server_engine_start(dsv4_model *m, const server_engine_opts *o, server_engine **out, dsv4_error *err) {
    *out = NULL;
    server_engine *e = calloc(1, sizeof *e);
    if (!e) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    e->m = m;
    e->o = *o;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    e->vocab = info.vocab_size;
    dsv4_sched_opts so = {o->max_streams, o->step_tokens};
    int rc = dsv4_sched_new(m, &so, &e->sched, err);
    if (rc) { free(e); return rc; }
    dsv4_sched_set_observer(e->sched, on_token, e);
    dsv4_sched_observer_needs_logits(e->sched, 0);   /* on_token reads rows only for logprobs, which keep their hook */
    if (o->pcache) dsv4_sched_set_prefix_cache(e->sched, o->pcache);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        dsv4_sched_free(e->sched);
        free(e);
        return dsv4_fail(err, DSV4_E_NOMEM, "cannot start the engine thread");
    }
    e->started = 1;
    *out = e;
    return 0;
}

void server_engine_stop(server_engine *e) {
    if (!e || !e->started) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->started = 0;
    /* jobs submitted after the loop ended (none: submit refuses once stopping) */
}

void server_engine_free(server_engine *e) {
    if (!e) return;
    server_engine_stop(e);
    dsv4_sched_free(e->sched);
    free(e->incoming);
    free(e->active);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    free(e);
}

int server_engine_submit(server_engine *e, server_job **jobs, int n) {
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    if (e->stopping) rc = 503;
    else if (e->outstanding + n > e->o.max_streams + e->o.max_queue) rc = 429;
    for (int i = 0; i < n && !rc; i++)
        if (push(&e->incoming, &e->n_in, &e->cap_in, jobs[i])) { e->n_in -= i; rc = 503; }
    if (!rc) {
        for (int i = 0; i < n; i++) {
            jobs[i]->refs++;
            e->prompt_tokens += jobs[i]->n_prompt;
        }
        e->outstanding += n;
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void server_engine_cancel(server_engine *e, server_job *j) {
    pthread_mutex_lock(&e->mu);
    if (!j->done && !j->cancel) {
        j->cancel = 1;
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->mu);
}

void server_engine_lock(server_engine *e) { pthread_mutex_lock(&e->mu); }
void server_engine_unlock(server_engine *e) { pthread_mutex_unlock(&e->mu); }

void server_engine_wait(server_engine *e, server_waiter *w, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    ts.tv_sec += timeout_ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&w->cond, &e->mu, &ts);
}

void server_engine_get_stats(server_engine *e, server_engine_stats *st) {
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&e->mu);
    st->running = e->running;
    st->waiting = e->outstanding - e->running > 0 ? e->outstanding - e->running : 0;
    st->steps = e->steps;
    st->step_tokens = e->step_tokens;
    st->prompt_tokens = e->prompt_tokens;
    st->generated_tokens = e->generated_tokens;
    st->cached_tokens = e->cached_tokens;
    st->state_bytes = e->state_bytes;
    st->pcache = e->pcache_stats;
    st->have_pcache = e->o.pcache != NULL;
    pthread_mutex_unlock(&e->mu);
}
