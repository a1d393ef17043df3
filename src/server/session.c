/* One generation request: see session.h. */
#include "server/session.h"
#include "server/constraint_hook.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define READ_CHUNK 64

static int nomem(server_error *e) { return server_fail(e, 500, "server_error", "", "out of memory"); }

/* Prompt ids: the rendered chat text, the completion text, or the given ids (checked against the vocabulary). */
static int tokenize_prompt(server_session *s, server_error *e) {
    const server_request *r = &s->req;
    if (r->prompt_ids) {
        for (int i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= s->srv->vocab) {
                char p[48];
                snprintf(p, sizeof p, "prompt[%d]", i);
                return server_fail(e, 400, "invalid_request_error", p, "%s: token id %d is outside the vocabulary (0..%d)",
                                   p, r->prompt_ids[i], s->srv->vocab - 1);
            }
        s->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt_ids);
        if (!s->prompt) return nomem(e);
        memcpy(s->prompt, r->prompt_ids, sizeof(int32_t) * (size_t)r->n_prompt_ids);
        s->n_prompt = r->n_prompt_ids;
        return 0;
    }
    size_t n = 0;
    dsv4_error err = {0};
    /* added tokens are matched: the chat encoding writes its markers as text */
    if (dsv4_tokenizer_encode(s->srv->tok, r->prompt_text, strlen(r->prompt_text), 0, &s->prompt, &n, &err))
        return server_fail(e, 400, "invalid_request_error", r->api == SERVER_API_COMPLETIONS ? "prompt" : "messages",
                           "the prompt cannot be tokenized: %s", err.msg);
    if (n == 0) return server_fail(e, 400, "invalid_request_error", "prompt", "the prompt encodes to no tokens");
    if (n > (size_t)INT32_MAX / 2) return server_fail(e, 400, "invalid_request_error", "prompt", "the prompt is too long");
    s->n_prompt = (int)n;
    return 0;
}

/* prompt + max_tokens must fit the context; a missing max_tokens takes what is left (chat) */
static int check_context(server_session *s, server_error *e) {
    const int64_t ctx = s->srv->ctx;
    const char *field = s->req.api == SERVER_API_COMPLETIONS ? "prompt" : "messages";
    if (s->n_prompt >= ctx)
        return server_fail(e, 400, "invalid_request_error", field,
                           "this model's context is %lld tokens; the prompt has %d tokens, leaving none to generate",
                           (long long)ctx, s->n_prompt);
    long long mt = s->req.max_tokens;
    if (mt < 0) mt = ctx - s->n_prompt;
    if (s->n_prompt + mt > ctx)
        return server_fail(e, 400, "invalid_request_error", "max_tokens",
                           "this model's context is %lld tokens; the prompt has %d tokens and max_tokens is %lld "
                           "(%lld > %lld)", (long long)ctx, s->n_prompt, mt, (long long)(s->n_prompt + mt), (long long)ctx);
    s->max_new = (int)mt;
    return 0;
}

static int make_jobs(server_session *s, server_error *e) {
    server_ctx *srv = s->srv;
    const server_request *r = &s->req;
    int32_t stops[2];
    int n_stops = 0;
    if (srv->eos_id >= 0) stops[n_stops++] = srv->eos_id;
    /* a chat reply may not open a user turn: <｜User｜> ends it too (as in `dsv4 chat`) */
    if (r->api != SERVER_API_COMPLETIONS && srv->user_id >= 0) stops[n_stops++] = srv->user_id;
    int32_t skip[3];
    int n_skip = 0;
    for (int i = 0; i < n_stops; i++) skip[n_skip++] = stops[i];
    skip[n_skip++] = srv->model_eos;
    const uint64_t base_seed = r->seed_given ? r->sampling.seed
                                              : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL + atomic_fetch_add(&srv->next_id, 1);
    if (r->n < 1 || r->n > SERVER_MAX_CHOICES) return server_fail(e, 400, "invalid_request_error", "n", "n: at most %d", SERVER_MAX_CHOICES);
    s->ch = calloc((size_t)r->n, sizeof *s->ch);
    if (!s->ch) return nomem(e);
    const int chat = r->api != SERVER_API_COMPLETIONS;
    for (int i = 0; i < r->n; i++) {
        server_choice *c = &s->ch[i];
        server_job_spec spec = {0};
        spec.prompt = s->prompt;
        spec.n_prompt = s->n_prompt;
        spec.sampling = r->sampling;
        spec.sampling.seed = base_seed + (uint64_t)i;
        spec.max_new = s->max_new;
        spec.stop_on_eos = !r->ignore_eos;
        spec.stop_ids = stops;
        spec.n_stop_ids = r->ignore_eos ? 0 : n_stops;
        spec.proc.mask_from = dsv4_tokenizer_vocab_size(srv->tok);
        spec.proc.presence = r->presence_penalty;
        spec.proc.frequency = r->frequency_penalty;
        spec.want_logprobs = r->logprobs;
        spec.top_logprobs = r->top_logprobs;
        spec.waiter = &s->waiter;
        if (r->response_format) {
            /* each job owns its grammar: a job may outlive this session (until the engine retires it) */
            if (server_constraint_compile((server_constraint_kind)r->rf_kind, r->response_format, r->rf_param, r->thinking,
                                          &spec.grammar, e))
                return e->status;
            spec.cvocab = srv->cvocab;
        }
        if (r->tool_mode >= 0) {
            if (server_constraint_tools(r, &spec.grammar, e)) return e->status;
            spec.cvocab = srv->cvocab;
        }
        if (server_job_new(&spec, &c->job)) return nomem(e);
        if (server_output_init(&c->out, srv->tok, chat, r->thinking, r->stop, r->n_stop, skip, n_skip)) return nomem(e);
    }
    return 0;
}

int server_session_start(server_ctx *srv, server_api api, const char *body, size_t len, server_session **out,
                         server_error *e) {
    *out = NULL;
    server_session *s = calloc(1, sizeof *s);
    if (!s) return nomem(e);
    s->srv = srv;
    s->t_start = server_now_s();
    s->created = (long)time(NULL);
    int rc = server_parse_request(api, body, len, &srv->limits, &s->req, e);
    if (!rc && server_waiter_init(&s->waiter)) rc = nomem(e);
    else if (!rc) s->waiter_ok = 1;
    if (!rc) rc = tokenize_prompt(s, e);
    if (!rc) rc = check_context(s, e);
    if (!rc) rc = make_jobs(s, e);
    if (!rc && s->req.echo && s->req.prompt_text && !(s->echo_text = strdup(s->req.prompt_text))) rc = nomem(e);
    if (!rc && s->req.echo && !s->req.prompt_text) {
        char *t = NULL;
        size_t tl = 0;
        if (dsv4_tokenizer_decode(srv->tok, s->prompt, (size_t)s->n_prompt, &t, &tl, NULL)) rc = nomem(e);
        s->echo_text = t;
    }
    if (!rc) {
        const unsigned long long id = atomic_fetch_add(&srv->next_id, 1);
        snprintf(s->id, sizeof s->id, "%s%llx%06llx", api == SERVER_API_MESSAGES ? "msg_" : api == SERVER_API_CHAT ? "chatcmpl-" : "cmpl-",
                 (unsigned long long)s->created, id);
        server_job *jobs[SERVER_MAX_CHOICES];
        for (int i = 0; i < s->req.n; i++) jobs[i] = s->ch[i].job;
        const int sub = server_engine_submit(srv->engine, jobs, s->req.n);
        if (sub == 429) rc = server_fail(e, 429, "rate_limit_error", "", "the server's queue is full; retry shortly");
        else if (sub) rc = server_fail(e, 503, "server_error", "", "the server is shutting down");
        else s->submitted = 1;
    }
    if (rc) { server_session_free(s); return rc; }
    *out = s;
    return 0;
}

static void log_token(server_choice *c, const server_token *t) {
    if (c->n_log == c->cap_log) {
        const int nc = c->cap_log ? 2 * c->cap_log : 32;
        server_token *v = realloc(c->log, sizeof *v * (size_t)nc);
        if (!v) return;
        c->log = v;
        c->cap_log = nc;
    }
    c->log[c->n_log++] = *t;
}

static server_end end_of(dsv4_finish f) {
    switch (f) {
    case DSV4_FINISH_EOS:
    case DSV4_FINISH_STOP: return SERVER_END_EOS;
    case DSV4_FINISH_LENGTH:
    case DSV4_FINISH_CONTEXT: return SERVER_END_LENGTH;
    case DSV4_FINISH_CANCELLED: return SERVER_END_CANCELLED;
    default: return SERVER_END_ERROR;
    }
}

int server_session_poll(server_session *s, int timeout_ms) {
    server_engine *eng = s->srv->engine;
    const int n = s->req.n;
    server_token buf[READ_CHUNK];
    int all_done = 1;
    for (int i = 0; i < n; i++) all_done &= s->ch[i].end != SERVER_END_NONE;
    if (all_done) return 1;
    server_engine_lock(eng);
    int ready = 0;
    for (int i = 0; i < n && !ready; i++) {
        const server_choice *c = &s->ch[i];
        if (c->end == SERVER_END_NONE && (c->have < server_job_n_tokens(c->job) || server_job_done(c->job))) ready = 1;
    }
    if (!ready && timeout_ms > 0) server_engine_wait(eng, &s->waiter, timeout_ms);
    all_done = 1;
    for (int i = 0; i < n; i++) {
        server_choice *c = &s->ch[i];
        if (c->end != SERVER_END_NONE) continue;
        for (;;) {
            const int got = server_job_read(c->job, &c->have, buf, READ_CHUNK);
            if (!got) break;
            /* the lock is held only for the copy: text processing happens after, on this thread's data */
            server_engine_unlock(eng);
            for (int k = 0; k < got && c->end == SERVER_END_NONE; k++) {
                if (s->t_first == 0) s->t_first = server_now_s();
                if (s->req.logprobs || s->req.return_token_ids) log_token(c, &buf[k]);
                if (server_output_push(&c->out, buf[k].id)) c->end = SERVER_END_STOP_STRING;
            }
            server_engine_lock(eng);
            if (c->end != SERVER_END_NONE) break;
        }
        if (c->end == SERVER_END_STOP_STRING) {
            /* cancel under the lock we hold: a flag the engine sees before its next step */
            server_engine_unlock(eng);
            server_engine_cancel(eng, c->job);
            server_engine_lock(eng);
            server_output_finish(&c->out);
        } else if (server_job_done(c->job) && c->have == server_job_n_tokens(c->job)) {
            c->end = end_of(server_job_finish(c->job));
            server_output_finish(&c->out);
        }
        if (server_job_cached(c->job) > s->cached) s->cached = server_job_cached(c->job);
        all_done &= c->end != SERVER_END_NONE;
    }
    server_engine_unlock(eng);
    return all_done;
}

void server_session_cancel(server_session *s) {
    if (!s->submitted) return;
    for (int i = 0; i < s->req.n; i++)
        if (s->ch[i].job && s->ch[i].end == SERVER_END_NONE) server_engine_cancel(s->srv->engine, s->ch[i].job);
}

void server_session_free(server_session *s) {
    if (!s) return;
    if (s->ch) {
        for (int i = 0; i < s->req.n; i++) {
            server_choice *c = &s->ch[i];
            if (c->job) server_job_release(s->submitted ? s->srv->engine : NULL, c->job);
            server_output_free(&c->out);
            free(c->log);
        }
        free(s->ch);
    }
    if (s->waiter_ok) server_waiter_destroy(&s->waiter);
    free(s->prompt);
    free(s->echo_text);
    server_request_free(&s->req);
    free(s);
}

int server_session_completion_tokens(const server_session *s) {
    int t = 0;
    for (int i = 0; i < s->req.n; i++) t += s->ch[i].out.n_tokens;
    return t;
}

int server_session_failed(const server_session *s) {
    for (int i = 0; i < s->req.n; i++)
        if (s->ch[i].end == SERVER_END_ERROR) return 1;
    return 0;
}
