/* The DSpark drafter (spec §14.5): run the drafting block for the pending token, then walk its rows in order:
 * each row's logits are corrected by the Markov head with the PREVIOUS draft token (the anchor for the first),
 * the draft is drawn from the corrected row (argmax under greedy), and the confidence head scores it
 * (core/dspark.h dsv4_dspark_draft: on a cuda model all on the GPU, only the drafts, their confidences and, when
 * sampling, their distributions come back). The drafting distribution of row j is therefore the sampler's over
 * the corrected logits given d_1..d_{j-1}, which is exactly what lossless verification needs (p_d). The context
 * ring only ever receives committed positions (on_commit, from the verification step's target features), so
 * rejected drafts leave no trace. */
#include "core/dspark.h"
#include "engine/drafter_dspark.h"
#include "model/model.h"
#include "state/prefix_companion.h"
#include "util/error.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dsv4_model *m;
    dsv4_dspark_ctx *ctx;
    dsv4_sampler smp;     /* the stream's parameters, its own random stream (draw counter) */
    int gamma;
    float *z;             /* [gamma] confidence logits */
} dspark_ctx;

static void dspark_free(void *p) {
    dspark_ctx *c = p;
    if (!c) return;
    dsv4_dspark_ctx_free(c->ctx);
    dsv4_sampler_free(&c->smp);
    free(c->z);
    free(c);
}

static int dspark_propose(void *p, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                          float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    dspark_ctx *c = p;
    *probs_given = 0;
    /* the context must hold every committed position before the pending one (the anchor) */
    if (dsv4_dspark_ctx_position(c->ctx) != n_hist || max_k < 1) return 0;
    const int k = max_k < c->gamma ? max_k : c->gamma;
    const int sampled = draft_probs && c->smp.params.temperature > 0.0f;
    int rc = dsv4_dspark_draft(c->m, c->ctx, last, k, &c->smp.params, c->smp.counter, draft, c->z,
                               sampled ? draft_probs : NULL, NULL, err);
    if (rc) return rc;
    /* every block owns the draws counter .. counter+gamma-1 whatever k is: a caller that asks for fewer drafts
     * (a scheduler step short of budget) gets a prefix of the drafts an unconstrained caller gets, and the draws
     * after it do not shift (tests/unit/test_sched_spec.c: scheduler streams = dsv4_spec_stream alone) */
    c->smp.counter += (uint64_t)c->gamma;
    if (confidence)
        for (int j = 0; j < k; j++) confidence[j] = 1.0f / (1.0f + expf(-c->z[j]));
    *probs_given = sampled;
    if (confidence) *conf_given = 1;
    return k;
}

/* The committed rows' target features extend every stage's context ring. */
static int dspark_on_commit(void *p, const int32_t *committed, int n_committed, const dsv4_spec_verify_info *vi,
                            dsv4_error *err) {
    dspark_ctx *c = p;
    if (vi->n_processed <= 0) return 0;
    if (!vi->hidden) return dsv4_fail(err, DSV4_E_STATE, "DSpark drafter: the step gave no target features");
    if (dsv4_dspark_ctx_position(c->ctx) != vi->pos0)
        return dsv4_fail(err, DSV4_E_STATE, "DSpark drafter: context at %lld, committed rows start at %lld",
                         (long long)dsv4_dspark_ctx_position(c->ctx), (long long)vi->pos0);
    return dsv4_dspark_commit(c->m, c->ctx, vi->hidden, vi->n_processed, err);
}

/* Prefix reuse. The context ring of position P holds keys of positions P-W..P-1 made from the target's features
 * there; a cached target state does not keep those features, and recomputing them would mean running the target
 * over the last W positions again. The ring itself is small (n_stages x W x head_dim floats) and depends on the
 * tokens 0..P-1 only (the cache's key), so it is stored beside the entry and copied back: exact and cheap. On
 * disk it is the ring's bytes (dspark_codec), checked against the model's shapes and the entry's position. */
typedef struct {
    prefix_companion base;
    dsv4_dspark_ctx *ctx;
} dspark_prefix;

static void dspark_prefix_free(prefix_companion *p) {
    dsv4_dspark_ctx_free(((dspark_prefix *)p)->ctx);
    free(p);
}

/* The disk tier's bytes of a stored context: the ring as it is (core/dspark.h dsv4_dspark_ctx_encode). */
static int dspark_prefix_encode(const prefix_companion *p, void **buf, size_t *len, dsv4_error *err) {
    return dsv4_dspark_ctx_encode(((const dspark_prefix *)p)->ctx, buf, len, err);
}

static int dspark_prefix_decode(dsv4_model *m, const int32_t *tokens, int64_t pos, const void *buf, size_t len,
                                prefix_companion **out, dsv4_error *err);

static const prefix_codec dspark_codec = { "dspark", dspark_prefix_encode, dspark_prefix_decode };

static int dspark_prefix_decode(dsv4_model *m, const int32_t *tokens, int64_t pos, const void *buf, size_t len,
                                prefix_companion **out, dsv4_error *err) {
    (void)tokens;   /* the container checked that they are the entry's; the ring alone is the state */
    if (!m->dspark) return dsv4_fail(err, DSV4_E_STATE, "DSpark drafter state, but this checkpoint has no DSpark drafter");
    dspark_prefix *st = calloc(1, sizeof *st);
    if (!st) return dsv4_fail(err, DSV4_E_NOMEM, "DSpark drafter: out of memory");
    int rc = dsv4_dspark_ctx_decode(m, buf, len, pos, &st->ctx, err);
    if (rc) { free(st); return rc; }
    st->base = (prefix_companion){ .kind = "dspark", .bytes = sizeof *st + dsv4_dspark_ctx_bytes(st->ctx),
                                   .free = dspark_prefix_free, .codec = &dspark_codec };
    *out = &st->base;
    return 0;
}

static int dspark_prefix_save(void *p, prefix_companion **out, dsv4_error *err) {
    dspark_ctx *c = p;
    dspark_prefix *st = calloc(1, sizeof *st);
    if (!st) return dsv4_fail(err, DSV4_E_NOMEM, "DSpark drafter: out of memory");
    int rc = dsv4_dspark_ctx_clone(c->m, c->ctx, &st->ctx, err);
    if (rc) { free(st); return rc; }
    st->base = (prefix_companion){ .kind = "dspark", .bytes = sizeof *st + dsv4_dspark_ctx_bytes(st->ctx),
                                   .free = dspark_prefix_free, .codec = &dspark_codec };
    *out = &st->base;
    return 0;
}

static int dspark_prefix_load(void *p, const prefix_companion *st, int32_t next, dsv4_error *err) {
    (void)next;   /* the context of P does not depend on the token at P */
    dspark_ctx *c = p;
    dsv4_dspark_ctx *copy;
    int rc = dsv4_dspark_ctx_clone(c->m, ((const dspark_prefix *)st)->ctx, &copy, err);
    if (rc) return rc;
    dsv4_dspark_ctx_free(c->ctx);
    c->ctx = copy;
    return 0;
}

int dsv4_drafter_dspark(dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err) {
    if (!m || !sp || !out) return dsv4_fail(err, DSV4_E_ARG, "DSpark drafter: missing argument");
    if (!m->dspark)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "this checkpoint has no DSpark drafter (mtp.0.main_proj); "
                         "--spec dspark needs a V4-Flash-0731 checkpoint");
    dspark_ctx *c = calloc(1, sizeof *c);
    if (!c) return dsv4_fail(err, DSV4_E_NOMEM, "DSpark drafter: out of memory");
    c->m = m;
    c->gamma = m->cfg.dspark_block_size;
    dsv4_sampling dsp = *sp;
    dsp.seed = sp->seed ^ 0x64737061726b2121ULL;   /* its own random stream, not the verifier's */
    int rc = dsv4_sampler_init(&c->smp, &dsp, m->cfg.vocab_size, err);
    if (!rc) rc = dsv4_dspark_ctx_new(m, &c->ctx, err);
    c->z = malloc(sizeof(float) * (size_t)(c->gamma > 0 ? c->gamma : 1));
    if (!rc && !c->z) rc = dsv4_fail(err, DSV4_E_NOMEM, "DSpark drafter: out of memory");
    if (rc) { dspark_free(c); return rc; }
    *out = (dsv4_drafter){ .name = "dspark", .ctx = c, .propose = dspark_propose, .on_commit = dspark_on_commit,
                           .free = dspark_free, .prefix_save = dspark_prefix_save, .prefix_load = dspark_prefix_load,
                           .prefix_codec = &dspark_codec,
                           .hidden_dim = m->cfg.n_dspark_targets * m->cfg.dim,
                           .dspark_features = 1 };
    return 0;
}
