/* The server's engine thread: it owns the model's scheduler (engine/scheduler.h) and is the only thread that
 * steps it; HTTP threads hand it jobs and read their tokens back.
 *
 * Concurrency: one mutex guards the submission list, every job's published output and the counters. The
 * engine takes it only between steps (to admit jobs, apply cancellations, publish the tokens a step made) and
 * never holds it across dsv4_sched_step; HTTP threads take it to submit, cancel and copy tokens out. Each HTTP
 * request has one server_waiter (a condition variable on that mutex) shared by its jobs (n choices), which the
 * engine signals when one of them gets tokens or finishes.
 *
 * Ownership: a job is created by the HTTP thread (server_job_new) and reference-counted between it and the
 * engine: server_engine_submit gives the engine a reference, which it drops when the job has finished;
 * server_job_release drops the HTTP thread's. The last one frees it. Prompt and stop tokens are the job's. */
#ifndef DSV4_SERVER_ENGINE_H
#define DSV4_SERVER_ENGINE_H
#include "dsv4.h"
#include "engine/constraint.h"
#include "engine/scheduler.h"
#include "server/logits.h"
#include <pthread.h>
#include <stdint.h>

#define SERVER_MAX_TOP_LOGPROBS 20

typedef struct server_engine server_engine;

typedef struct {
    pthread_cond_t cond;
} server_waiter;

/* One generated token as the HTTP side sees it. */
typedef struct {
    int32_t id;
    float logprob;                               /* when the job asked for logprobs */
    int n_top;
    server_logprob top[SERVER_MAX_TOP_LOGPROBS];
} server_token;

typedef struct server_job server_job;

/* What a job asks for (copied into the job). */
typedef struct {
    const int32_t *prompt;
    int n_prompt;
    dsv4_sampling sampling;
    int max_new;
    int stop_on_eos;             /* the checkpoint's EOS ends the job */
    const int32_t *stop_ids;     /* single-token stops (the chat format's end-of-turn markers) */
    int n_stop_ids;
    server_logits_proc proc;     /* penalties and mask (its counts scratch must be NULL) */
    int want_logprobs, top_logprobs;
    server_waiter *waiter;       /* borrowed: must outlive the job's last engine_read */
    dsv4_grammar *grammar;       /* NULL, or a constraint the job takes over (freed with it, also on failure) */
    const dsv4_cvocab *cvocab;   /* with a grammar: the vocabulary trie (borrowed; outlives the engine) */
} server_job_spec;

int  server_job_new(const server_job_spec *spec, server_job **out);
void server_job_release(server_engine *e, server_job *j);

typedef struct {
    int max_streams;             /* scheduler slots */
    int step_tokens;             /* scheduler token budget per step */
    int max_queue;               /* jobs waiting beyond the running ones before submissions get 429 */
    dsv4_prefix_cache *pcache;   /* borrowed, optional */
    /* speculative decoding of every stream inside the scheduler (dsv4_sched_spec): a drafter name of
     * engine/drafter_named.h (borrowed string), NULL or "none" = off */
    const char *spec;
    int draft;                   /* drafts per step */
    float spec_threshold;        /* DSpark survival-product cut, 0 = off */
} server_engine_opts;

/* Counters for /metrics (a consistent copy). */
typedef struct {
    int waiting, running;
    int64_t steps, step_tokens, prompt_tokens, generated_tokens, cached_tokens;
    size_t state_bytes;
    dsv4_prefix_cache_stats pcache;
    int have_pcache;
    const char *spec;            /* the drafter's name, NULL without speculation */
    int64_t spec_steps, spec_drafted, spec_accepted;   /* summed over finished requests */
} server_engine_stats;

int  server_engine_start(dsv4_model *m, const server_engine_opts *o, server_engine **out, dsv4_error *err);
/* Stop: refuse new jobs, cancel every job (readers see them finish as CANCELLED), join the thread. The
 * engine's lock stays usable, so HTTP threads can still read and release their jobs until server_engine_free. */
void server_engine_stop(server_engine *e);
void server_engine_free(server_engine *e);

/* Submit n jobs at once (a request's choices): all or none. Returns 0, 429 when the queue is full (nothing
 * submitted) or 503 when the engine is stopping. */
int  server_engine_submit(server_engine *e, server_job **jobs, int n);
/* Ask the engine to cancel a job (its state is freed within one step). */
void server_engine_cancel(server_engine *e, server_job *j);

/* Under the engine lock: wait until one of the waiter's jobs changed or timeout_ms passed. Returns at once
 * when `ready` says there is something to read. */
void server_engine_lock(server_engine *e);
void server_engine_unlock(server_engine *e);
void server_engine_wait(server_engine *e, server_waiter *w, int timeout_ms);

/* Called with the lock held: copy tokens [*have, n) into out (capacity cap) and advance *have; returns the
 * number copied. */
int  server_job_read(const server_job *j, int *have, server_token *out, int cap);
/* With the lock held: job state. */
int         server_job_done(const server_job *j);
int         server_job_n_tokens(const server_job *j);
dsv4_finish server_job_finish(const server_job *j);
int64_t     server_job_cached(const server_job *j);
double      server_job_first_token_s(const server_job *j);  /* monotonic seconds of the first token, 0 = none */

void server_engine_get_stats(server_engine *e, server_engine_stats *st);
double server_now_s(void);

int  server_waiter_init(server_waiter *w);
void server_waiter_destroy(server_waiter *w);
#endif
