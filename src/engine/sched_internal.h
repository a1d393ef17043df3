/* The scheduler's records, shared by scheduler.c (admission, steps, sampling) and sched_spec.c (speculative
 * streams). Internal to src/engine: nothing outside those two files looks inside. */
#ifndef DSV4_ENGINE_SCHED_INTERNAL_H
#define DSV4_ENGINE_SCHED_INTERNAL_H
#include "engine/constraint_cache.h"
#include "engine/scheduler.h"

typedef struct {
    int32_t *prompt;
    int n_prompt;
    dsv4_sampling sampling;
    int max_new, stop_on_eos;
    int32_t *stop_tok;            /* all stop sequences, concatenated */
    int *stop_len;                /* [n_stop] */
    int n_stop;
    dsv4_req_state state;
    dsv4_finish finish;
    int32_t *out;                 /* generated tokens [n_out], capacity out_cap */
    int n_out, out_cap;
    int64_t n_prompt_done;        /* kept after the slot is freed, for results */
    int64_t n_cached;             /* prompt tokens reused from the prefix cache */
    dsv4_logits_hook hook;
    int slot;                     /* -1 unless running */
    int released;
    const dsv4_grammar *grammar;  /* borrowed; NULL = unconstrained */
    const dsv4_cvocab *cvocab;
    dsv4_cmatcher *matcher;       /* borrowed; NULL = a private one per stream */
    dsv4_sched_spec spec;         /* spec.make NULL: no speculation */
    int64_t spec_steps, spec_drafted, spec_accepted;
} request;

/* A speculating stream's drafter and per-step buffers (sized for spec.draft drafts). */
typedef struct {
    dsv4_drafter dr;              /* owned; dr.propose NULL: the stream does not speculate */
    dsv4_spec_drafts d;           /* this step's anchor and drafts */
    uint64_t rng[4];              /* the acceptance test's random stream */
    float *hidden;                /* [hidden_rows][dr.hidden_dim] target features for the drafter, or NULL */
    int hidden_rows;
    dsv4_seq_snapshot *snap;      /* the sequence before this step's item */
    int synced;                   /* the drafter has taken every row the sequence holds (prefix_save may store it) */
} slot_spec;

typedef struct {
    int64_t req;                  /* -1: free */
    dsv4_seq *seq;
    dsv4_sampler smp;
    dsv4_cstate *cs;              /* the stream's constraint state, NULL = unconstrained */
    dsv4_cmatcher *cm;            /* its matcher when pinned in the scheduler's cache (released with cs) */
    int32_t pending;              /* the last sampled token, fed by the next step (a speculating stream's
                                   * anchor: its last prompt token at first) */
    float *logits;                /* [logits_rows][vocab]: the row(s) this slot samples from */
    int logits_rows;              /* 1, or 1 + spec.draft for a speculating stream */
    slot_spec sp;
    int in_step;                  /* this step draws the slot's token (dsv4_step_item.sample) */
    int32_t drawn;                /* ... into here */
} slot;

struct dsv4_sched {
    dsv4_model *m;
    dsv4_sched_opts o;
    int vocab, eos;
    int64_t max_pos;
    request *req;
    int64_t n_req, cap_req;
    int64_t base;                 /* id of req[0]: released records at the front are dropped (a long-running
                                   * server must not keep one record per request it ever served) */
    int64_t wait_head;            /* requests before it are not waiting: admission is FIFO by id */
    slot *slots;
    dsv4_step_item *items;        /* [max_streams] scratch for one step */
    int *item_slot;               /* [max_streams] slot of each item */
    int *prefill_order;           /* [max_streams] scratch */
    int rr;                       /* first slot the decode pass looks at (rotates for fairness) */
    int n_running, last_T;
    int64_t n_pending;
    dsv4_sched_token_fn on_token;
    void *on_token_ctx;
    int observer_logits;          /* the observer reads its logits argument (default) */
    dsv4_prefix_cache *pcache;    /* borrowed, optional */
    float *spec_scratch;          /* [2][vocab] for verification, allocated with the first speculating stream */
    dsv4_cmcache *mcache;         /* matchers of requests that give a grammar, shared by grammar (warm masks) */
};


static inline request *sched_req(const dsv4_sched *s, int64_t id) { return &s->req[id - s->base]; }
static inline int sched_speculates(const slot *sl) { return sl->sp.dr.propose != NULL; }

/* scheduler.c */
void sched_finish(dsv4_sched *s, int64_t id, dsv4_finish why);
int  sched_ends_with_stop(const request *q);
/* Store the slot's state in the prefix cache, with its drafter's state when it keeps one (prefix_companion.h). */
void sched_cache_put(dsv4_sched *s, int slot_i);

/* sched_spec.c: a speculating stream's share of the step (see scheduler.h, dsv4_sched_spec) */
int  sched_spec_make(dsv4_sched *s, const request *q, slot_spec *sp);      /* the drafter, at admission */
int  sched_spec_alloc(dsv4_sched *s, slot *sl, const request *q);          /* its buffers, after the state */
void sched_spec_release(slot_spec *sp);
/* Gather the drafts of a decoding stream and append its item ([anchor, drafts], every row's logits); returns
 * the tokens it takes from the budget, or -1 when the stream failed (it is finished as ERROR). */
int  sched_spec_add_item(dsv4_sched *s, int *n_items, int slot_i, long long budget);
/* After the step: a prompt chunk's rows reach the drafter; a decode item is verified and committed. */
void sched_spec_prompt_rows(dsv4_sched *s, int slot_i, int64_t p0, int len);
void sched_spec_commit(dsv4_sched *s, int slot_i);
#endif
