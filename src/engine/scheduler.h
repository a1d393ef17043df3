/* Continuous batching over the one forward primitive (DESIGN §2).
 *
 * A scheduler holds requests (a prompt, sampling parameters with their own seed, stop conditions) and runs
 * up to max_streams of them at once. Each dsv4_sched_step() builds ONE ragged dsv4_step call from the active
 * streams under a per-step token budget:
 *   1. every decoding stream contributes its one pending token (decode first: it keeps latency flat);
 *   2. what is left of the budget goes to prompt chunks, oldest request first, so a long prompt is split
 *      into chunks that interleave with the other streams' decoding.
 * Each stream whose prompt is complete gets one token sampled from its own sampler (inside the step when
 * nothing needs its logits on the host: dsv4_sched_observer_needs_logits). Finished or cancelled
 * streams free their sequence state at once, and waiting requests take the free slots before the next step
 * (continuous insertion). Because dsv4_step is exact per sequence, a stream's tokens and logits do not depend
 * on which other streams share its steps, nor on how its prompt was chunked.
 *
 * Ownership: the scheduler owns its sequences, samplers and per-request results; it borrows the model, which
 * must outlive it. Requests are copied on add. No global state: several schedulers may share a model only if
 * they never step concurrently (dsv4_step uses the model's workspace). */
#ifndef DSV4_ENGINE_SCHEDULER_H
#define DSV4_ENGINE_SCHEDULER_H
#include "dsv4.h"
#include "engine/constraint.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include <stdint.h>

typedef struct dsv4_sched dsv4_sched;

typedef struct {
    int max_streams;   /* concurrent streams (slots); >= 1 */
    int step_tokens;   /* token budget of one step; 0 = unlimited. Decode tokens beyond it wait a step (the
                        * start rotates so they share it); prompts advance only with what decode leaves, so a
                        * budget <= the number of decoding streams holds prompts back until a stream ends. */
} dsv4_sched_opts;

/* One stop token sequence: generation stops once the generated tokens end with it (the sequence stays in the
 * output, as EOS does; callers trim it if they want). */
typedef struct {
    const int32_t *tokens;
    int n;
} dsv4_stop_seq;

/* A per-request logits hook, called on the engine thread right before each sampling with the tokens generated
 * so far and the row the sampler is about to draw from (modifiable in place: penalties, masks, and the hook of
 * constrained decoding). The logits observer and the sampler see the row after it. A non-zero return finishes
 * the request as DSV4_FINISH_ERROR (the token is not sampled). fn NULL = no hook. ctx is borrowed: it must
 * outlive the request (until its result is released or the scheduler freed). */
typedef struct {
    int (*fn)(void *ctx, const int32_t *generated, int n_generated, float *logits, int vocab);
    void *ctx;
} dsv4_logits_hook;

/* Speculative decoding of one request inside the scheduler (speculative.h has the protocol). A speculating
 * stream processes its prompt but the last token, which becomes the anchor of its first step; every step
 * then feeds [anchor, d_1..d_k] (k drafts from the stream's own drafter) as that stream's share of the ONE
 * dsv4_step of all streams, verifies them with dsv4_spec_verify_rows (greedy: the argmax, so the tokens equal
 * a non-speculative run; sampled: the lossless acceptance test with the stream's own random stream, seeded
 * from its seed), rolls the sequence back to the committed tokens (O(1), dsv4_seq_rollback) and emits 1..k+1
 * tokens. The hook, the constraint, stop sequences, EOS, max_new_tokens and the observer apply to every
 * emitted token as without speculation (the hook sees each row with the drafts before it as generated).
 * Drafts per step are also bounded by the step's token budget, max_new_tokens and the model's positions.
 * A drafter that needs target features (MTP, DSpark: hidden_dim > 0) must see every prompt row, which a cached
 * target state does not keep: such a stream stores its drafter's state beside every state it puts in the prefix
 * cache (dsv4_drafter.prefix_save; for the final state the drafter first takes the last step's rows) and forks
 * only from entries that carry one of its kind, which it loads (prefix_load) — so its drafts, acceptance and
 * tokens are those of a stream that prefilled the whole prompt. With dsv4_drafter.prefix_codec (MTP, DSpark) the
 * drafter's state also goes to the cache's disk tier beside the state file and comes back on a disk hit (after a
 * restart, or once memory evicted the entry). Drafters without those hooks never fork. */
typedef struct {
    /* Makes the stream's drafter (called at admission with the request's sampling parameters); NULL = no
     * speculation. A failure finishes the request as ERROR. */
    int (*make)(void *ctx, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err);
    void *ctx;                  /* borrowed: must outlive the request */
    int draft;                  /* drafts per step, 1 .. the model's max_spec - 1 */
    float conf_threshold;       /* survival-product cut for drafters that give confidences (DSpark); 0 = off */
} dsv4_sched_spec;

typedef struct {
    const int32_t *prompt;      /* >= 1 token, ids inside the vocabulary */
    int n_prompt;
    dsv4_sampling sampling;     /* includes the stream's own seed */
    int max_new_tokens;         /* >= 0; 0 finishes at once with DSV4_FINISH_LENGTH */
    int stop_on_eos;            /* 1: stop after the model's EOS token is generated */
    const dsv4_stop_seq *stop;  /* n_stop stop sequences (copied) */
    int n_stop;
    /* Constrained output (constraint.h): NULL = none. Both borrowed; they must outlive the request. The stream
     * gets its own dsv4_cstate with a length bound of max_new_tokens - 1 bytes, so a constrained stream ends
     * with a complete value and EOS within its budget (see constraint.h); EOS ends it even without
     * stop_on_eos. The logits the observer sees are the masked ones. Finish reasons: EOS once the value is
     * complete; LENGTH only when max_new_tokens is below the shortest value (the stream then ends at once with
     * EOS as its last token and an incomplete value). */
    const dsv4_grammar *grammar;
    const dsv4_cvocab *cvocab;
    /* Or a shared matcher (borrowed, outlives the request; grammar and cvocab may then be NULL): requests with
     * the same schema share its transitions and mask caches. The scheduler uses it from its own thread only. */
    dsv4_cmatcher *matcher;
    dsv4_logits_hook hook;      /* optional (zero = none); runs before the constraint's mask */
    dsv4_sched_spec spec;       /* optional (zero = no speculation) */
} dsv4_request;

typedef enum {
    DSV4_REQ_WAITING = 0,       /* queued, no state yet */
    DSV4_REQ_RUNNING = 1,       /* holds a slot: prefilling or decoding */
    DSV4_REQ_DONE    = 2,       /* finished; state freed, result kept until released */
} dsv4_req_state;

typedef enum {
    DSV4_FINISH_NONE      = 0,  /* not finished */
    DSV4_FINISH_EOS       = 1,  /* generated the EOS token (it is the last output token) */
    DSV4_FINISH_LENGTH    = 2,  /* max_new_tokens reached */
    DSV4_FINISH_STOP      = 3,  /* the output ends with a stop sequence */
    DSV4_FINISH_CANCELLED = 4,  /* dsv4_sched_cancel */
    DSV4_FINISH_CONTEXT   = 5,  /* the model's maximum position was reached */
    DSV4_FINISH_ERROR     = 6,  /* its state could not be allocated */
} dsv4_finish;

typedef struct {
    dsv4_req_state state;
    dsv4_finish finish;
    const int32_t *tokens;      /* generated tokens; valid until the next add/step/cancel/release call */
    int n_tokens;
    int64_t n_prompt_done;      /* prompt tokens processed so far (cached ones included) */
    int64_t n_cached;           /* prompt tokens taken from the prefix cache at admission */
    int64_t spec_steps;         /* speculative steps the request took part in (0 without speculation) */
    int64_t spec_drafted;       /* drafts verified */
    int64_t spec_accepted;      /* drafts accepted */
} dsv4_req_result;

/* Called once per sampled token, right after sampling, with the logits row it was drawn from (valid only
 * during the call; NULL when the observer said it does not read it, below). Lets a server stream tokens and
 * tests compare logits. */
typedef void (*dsv4_sched_token_fn)(void *ctx, int64_t id, int index, int32_t token, const float *logits);

int  dsv4_sched_new(dsv4_model *m, const dsv4_sched_opts *o, dsv4_sched **out, dsv4_error *err);
void dsv4_sched_free(dsv4_sched *s);
void dsv4_sched_set_observer(dsv4_sched *s, dsv4_sched_token_fn fn, void *ctx);
/* Streams without a logits hook or a constraint draw their tokens inside dsv4_step (on a cuda model: on the GPU,
 * and only the ids come back), the same tokens as sampling the returned rows on the host. An observer that reads
 * the rows (the default: needed = 1) makes every step bring them back too; with needed = 0 it gets NULL for
 * those streams' tokens. Hooked and constrained streams always bring their row back and sample on the host. */
void dsv4_sched_observer_needs_logits(dsv4_sched *s, int needed);

/* Queue a request; its id (>= 0, increasing in add order) goes to *id. Invalid requests are refused. */
int dsv4_sched_add(dsv4_sched *s, const dsv4_request *r, int64_t *id, dsv4_error *err);
/* Cancel a waiting or running request: its state is freed at once and it finishes as CANCELLED with the
 * tokens generated so far. Cancelling a finished request does nothing. */
int dsv4_sched_cancel(dsv4_sched *s, int64_t id, dsv4_error *err);
/* Run one step (admit, one dsv4_step, sample, retire, admit). With nothing to do it returns 0 at once.
 * On error (the step's dsv4_step failed, or no memory) no stream advances and no token is sampled; the call
 * may be retried. Admissions and context-limit retirements made before the failure stand. */
int dsv4_sched_step(dsv4_sched *s, dsv4_error *err);
/* Reuse states through a prefix cache (borrowed, must outlive the scheduler; NULL = none). At admission a
 * request forks the longest stored state of its prompt minus the last token (dsv4_req_result.n_cached); the
 * state one token short of the prompt end is stored (the last prompt chunk is cut there, and the last prompt
 * token goes in the next step), and so is a finished stream's final state (prompt + output but the last
 * token), which is the stable prefix of the conversation's next turn. A state is exact at every position, so
 * outputs are the same with or without the cache. */
void dsv4_sched_set_prefix_cache(dsv4_sched *s, dsv4_prefix_cache *c);
/* Bytes of sequence state the running streams hold now (dsv4_seq_state_bytes summed). */
size_t dsv4_sched_state_bytes(const dsv4_sched *s);
/* Requests not yet done (waiting + running). */
int dsv4_sched_pending(const dsv4_sched *s);
/* Requests holding a slot right now. */
int dsv4_sched_running(const dsv4_sched *s);
/* Tokens the last step fed to dsv4_step (0 when it did nothing). */
int dsv4_sched_last_step_tokens(const dsv4_sched *s);

int dsv4_sched_result(const dsv4_sched *s, int64_t id, dsv4_req_result *out, dsv4_error *err);
/* Forget a finished request's result (its memory is freed; the id becomes unknown). */
int dsv4_sched_release(dsv4_sched *s, int64_t id, dsv4_error *err);

const char *dsv4_finish_name(dsv4_finish f);
#endif
