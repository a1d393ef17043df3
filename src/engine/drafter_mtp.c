/* The V4 MTP drafter ("MTP-1", spec §13): the MTP head turns the target's final HC state of position i and the
 * token at i+1 into a prediction of the token at i+2. One draft per step, as deployed before DSpark.
 *
 * Its own state is the MTP head's window ring of MTP rows (core/mtp.h). Only committed rows enter it: row i is
 * run once the target has committed position i and the token after it is known (on_commit gives both: the
 * verification step's hidden rows and the committed tokens). The last row run predicts the token after the
 * pending one — the next draft. Nothing speculative is ever written, so nothing needs rolling back. */
#include "core/mtp.h"
#include "engine/speculative.h"
#include "engine/drafter_mtp.h"
#include "model/model.h"
#include "state/prefix_companion.h"
#include "state/sequence.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
    dsv4_model *m;
    dsv4_seq *state;      /* MTP rows; its position is the next target position to pair */
    dsv4_sampler smp;     /* the stream's sampling parameters: the draft distribution is the sampler's over the
                             MTP logits, so the rejection test compares like with like */
    float *logits;        /* [vocab]: MTP logits of the last row run */
    float *x_last;        /* [hidden_dim]: the target's final HC state of the last committed row (prefix_save) */
    int have_draft, have_x;
    int vocab, hidden_dim;
} mtp_ctx;

static void mtp_free(void *ctx) {
    mtp_ctx *c = ctx;
    if (!c) return;
    dsv4_seq_free(c->state);
    dsv4_sampler_free(&c->smp);
    free(c->logits);
    free(c->x_last);
    free(c);
}

static int mtp_propose(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                       float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    mtp_ctx *c = ctx;
    *probs_given = 0;
    if (!c->have_draft || max_k < 1) return 0;
    c->have_draft = 0;
    if (draft_probs && c->smp.params.temperature > 0.0f) {
        /* sampled drafting: d ~ p_d, and p_d goes to the verifier */
        dsv4_sampler_distribution(&c->smp, c->logits, draft_probs);
        draft[0] = dsv4_sample(&c->smp, c->logits);
        *probs_given = 1;
    } else {
        draft[0] = dsv4_sample(&c->smp, c->logits);   /* greedy: argmax */
    }
    return 1;
}

/* Rows pos0 .. pos0+n-1 of the target committed; committed[r] is the token after row r. */
static int mtp_on_commit(void *ctx, const int32_t *committed, int n_committed, const dsv4_spec_verify_info *vi,
                         dsv4_error *err) {
    mtp_ctx *c = ctx;
    c->have_draft = 0;
    const int n = vi->n_processed < n_committed ? vi->n_processed : n_committed;
    if (n <= 0) return 0;
    if (!vi->hidden) return dsv4_fail(err, DSV4_E_STATE, "MTP drafter: the verification step gave no hidden states");
    if (dsv4_seq_position(c->state) != vi->pos0)
        return dsv4_fail(err, DSV4_E_STATE, "MTP drafter: rows are not consecutive (MTP at %lld, target rows from %lld)",
                         (long long)dsv4_seq_position(c->state), (long long)vi->pos0);
    int rc = dsv4_mtp_forward(c->m, c->state, vi->hidden, committed, n, DSV4_LOGITS_LAST, c->logits, err);
    if (rc) return rc;
    memcpy(c->x_last, vi->hidden + (size_t)(n - 1) * (size_t)c->hidden_dim, sizeof(float) * (size_t)c->hidden_dim);
    c->have_draft = c->have_x = 1;
    return 0;
}

/* Prefix reuse. MTP row i pairs the target's final HC state X_i with the token at i+1, and the head's window
 * attention reads the rows of the last W positions. A cached target state keeps no X_i, and recomputing them
 * would mean running the target over the last W positions again; the head's own state is small (one layer's
 * window ring), so it is stored beside the entry. Stored one row short: rows 0..P-2 and X_{P-1}, because row
 * P-1 also depends on the token at P, which the entry's key (tokens 0..P-1) does not fix (a later request may
 * continue the prefix with another token). Loading forks those rows and runs row P-1 with the request's own
 * token: one MTP row, and the state and the next draft's logits are exactly a full prefill's. */
typedef struct {
    prefix_companion base;
    dsv4_seq *rows;       /* MTP rows 0..P-2 */
    float *x;             /* [hidden_dim] X_{P-1} */
    int hidden_dim;
} mtp_prefix;

static void mtp_prefix_free(prefix_companion *p) {
    mtp_prefix *st = (mtp_prefix *)p;
    dsv4_seq_free(st->rows);
    free(st->x);
    free(st);
}

/* On disk (mtp_codec), what the head reads of its state and nothing else, little-endian:
 *   u32 hidden_dim | u32 window | u32 row bytes | u32 0 | i64 rows (P - 1)
 *   | row[min(rows, window)] the layer-0 window rows of positions rows - n .. rows - 1, oldest first (the MTP block
 *     is window-only: its other layers are never written) | f32 X_{P-1}[hidden_dim]
 * The state's tokens are not stored: MTP row i pairs with the token at i + 1, so they are the entry's tokens
 * 1 .. P-1, which the companion file is bound to. */
enum { MTP_DISK_HEADER = 24 };

static int64_t mtp_live_rows(int64_t rows, int window) { return rows < window ? rows : window; }

static int mtp_prefix_encode(const prefix_companion *p, void **buf, size_t *len, dsv4_error *err) {
    const mtp_prefix *st = (const mtp_prefix *)p;
    const dsv4_seq *r = st->rows;
    const int window = r->model->cfg.window;
    const int64_t rows = r->pos, live = mtp_live_rows(rows, window);
    const size_t rb = r->kv_main.bytes, total = MTP_DISK_HEADER + (size_t)live * rb + sizeof(float) * (size_t)st->hidden_dim;
    uint8_t *b = malloc(total);
    if (!b) return dsv4_fail(err, DSV4_E_NOMEM, "MTP drafter: out of memory for %zu bytes", total);
    const uint32_t head[4] = { (uint32_t)st->hidden_dim, (uint32_t)window, (uint32_t)rb, 0 };
    memcpy(b, head, sizeof head);
    memcpy(b + 16, &rows, 8);
    size_t o = MTP_DISK_HEADER;
    for (int64_t t = rows - live; t < rows; t++, o += rb) r->mem->to_host(b + o, seq_ring_at(r, &r->layer[0], t), rb);
    memcpy(b + o, st->x, sizeof(float) * (size_t)st->hidden_dim);
    *buf = b;
    *len = total;
    return 0;
}

static int mtp_prefix_decode(dsv4_model *m, const int32_t *tokens, int64_t pos, const void *buf, size_t len,
                             prefix_companion **out, dsv4_error *err);

static const prefix_codec mtp_codec = { "mtp", mtp_prefix_encode, mtp_prefix_decode };

static int mtp_prefix_decode(dsv4_model *m, const int32_t *tokens, int64_t pos, const void *buf, size_t len,
                             prefix_companion **out, dsv4_error *err) {
    if (!dsv4_model_has_mtp(m)) return dsv4_fail(err, DSV4_E_STATE, "MTP drafter state, but this checkpoint has no V4 MTP head");
    const uint8_t *b = buf;
    uint32_t head[4];
    int64_t rows;
    if (len < MTP_DISK_HEADER) return dsv4_fail(err, DSV4_E_FORMAT, "MTP drafter state: %zu bytes, not even a header", len);
    memcpy(head, b, sizeof head);
    memcpy(&rows, b + 16, 8);
    const int hidden_dim = m->cfg.hc_mult * m->cfg.dim, window = m->cfg.window;
    if (head[0] != (uint32_t)hidden_dim || head[1] != (uint32_t)window || head[3] != 0)
        return dsv4_fail(err, DSV4_E_STATE, "MTP drafter state of hidden size %u and window %u, this model's are %d and %d",
                         head[0], head[1], hidden_dim, window);
    if (pos < 1 || rows != pos - 1)
        return dsv4_fail(err, DSV4_E_STATE, "MTP drafter state of %lld rows for a prefix of %lld tokens (expected %lld)",
                         (long long)rows, (long long)pos, (long long)(pos - 1));
    mtp_prefix *st = calloc(1, sizeof *st);
    if (!st) return dsv4_fail(err, DSV4_E_NOMEM, "MTP drafter: out of memory");
    st->hidden_dim = hidden_dim;
    int rc = dsv4_seq_new(m, &st->rows, err);
    dsv4_seq *r = st->rows;
    const int64_t live = mtp_live_rows(rows, window);
    if (!rc && (head[2] != (uint32_t)r->kv_main.bytes ||
                len != MTP_DISK_HEADER + (size_t)live * r->kv_main.bytes + sizeof(float) * (size_t)hidden_dim))
        rc = dsv4_fail(err, DSV4_E_STATE, "MTP drafter state: %zu bytes with rows of %u bytes, this model expects %zu with rows of %zu",
                       len, head[2], MTP_DISK_HEADER + (size_t)live * r->kv_main.bytes + sizeof(float) * (size_t)hidden_dim,
                       r->kv_main.bytes);
    if (!rc && (seq_reserve(r, rows) || !(st->x = malloc(sizeof(float) * (size_t)hidden_dim))))
        rc = dsv4_fail(err, DSV4_E_NOMEM, "MTP drafter: out of memory");
    if (rc) { mtp_prefix_free(&st->base); return rc; }
    if (rows > 0) memcpy(r->tokens, tokens + 1, sizeof(int32_t) * (size_t)rows);
    size_t o = MTP_DISK_HEADER;
    for (int64_t t = rows - live; t < rows; t++, o += r->kv_main.bytes)
        r->mem->from_host(seq_ring_at(r, &r->layer[0], t), b + o, r->kv_main.bytes);
    memcpy(st->x, b + o, sizeof(float) * (size_t)hidden_dim);
    r->pos = rows;
    st->base = (prefix_companion){ .kind = "mtp", .bytes = sizeof *st + dsv4_seq_state_bytes(r) + sizeof(float) * (size_t)hidden_dim,
                                   .free = mtp_prefix_free, .codec = &mtp_codec };
    *out = &st->base;
    return 0;
}

static int mtp_prefix_save(void *ctx, prefix_companion **out, dsv4_error *err) {
    mtp_ctx *c = ctx;
    const int64_t P = dsv4_seq_position(c->state);
    if (!c->have_x || P < 1) return dsv4_fail(err, DSV4_E_STATE, "MTP drafter: no committed row to store");
    mtp_prefix *st = calloc(1, sizeof *st);
    if (!st) return dsv4_fail(err, DSV4_E_NOMEM, "MTP drafter: out of memory");
    st->hidden_dim = c->hidden_dim;
    int rc = dsv4_seq_fork(c->state, &st->rows, err);
    if (!rc) rc = seq_rewind(st->rows, P - 1, err);
    if (!rc && !(st->x = malloc(sizeof(float) * (size_t)c->hidden_dim))) rc = dsv4_fail(err, DSV4_E_NOMEM, "MTP drafter: out of memory");
    if (rc) { mtp_prefix_free(&st->base); return rc; }
    memcpy(st->x, c->x_last, sizeof(float) * (size_t)c->hidden_dim);
    st->base = (prefix_companion){ .kind = "mtp", .bytes = sizeof *st + dsv4_seq_state_bytes(st->rows) + sizeof(float) * (size_t)c->hidden_dim,
                                   .free = mtp_prefix_free, .codec = &mtp_codec };
    *out = &st->base;
    return 0;
}

static int mtp_prefix_load(void *ctx, const prefix_companion *p, int32_t next, dsv4_error *err) {
    mtp_ctx *c = ctx;
    const mtp_prefix *st = (const mtp_prefix *)p;
    if (st->hidden_dim != c->hidden_dim) return dsv4_fail(err, DSV4_E_STATE, "MTP drafter: the stored state belongs to another model");
    dsv4_seq *rows;
    int rc = dsv4_seq_fork(st->rows, &rows, err);
    if (rc) return rc;
    if ((rc = dsv4_mtp_forward(c->m, rows, st->x, &next, 1, DSV4_LOGITS_LAST, c->logits, err))) {
        dsv4_seq_free(rows);
        return rc;
    }
    dsv4_seq_free(c->state);
    c->state = rows;
    memcpy(c->x_last, st->x, sizeof(float) * (size_t)c->hidden_dim);
    c->have_draft = c->have_x = 1;
    return 0;
}

int dsv4_drafter_mtp(dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err) {
    if (!m || !sp || !out) return dsv4_fail(err, DSV4_E_ARG, "MTP drafter: missing argument");
    if (!dsv4_model_has_mtp(m))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "this checkpoint has no V4 MTP head (mtp.0.e_proj); --spec mtp needs one");
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    mtp_ctx *c = calloc(1, sizeof *c);
    if (!c) return dsv4_fail(err, DSV4_E_NOMEM, "MTP drafter: out of memory");
    c->m = m;
    c->vocab = info.vocab_size;
    c->hidden_dim = m->cfg.hc_mult * m->cfg.dim;
    dsv4_sampling dsp = *sp;
    dsp.seed = sp->seed ^ 0x6d74703a64726166ULL;   /* its own random stream, not the verifier's */
    int rc = dsv4_sampler_init(&c->smp, &dsp, info.vocab_size, err);
    /* the head's state lives where the model runs (dsv4_mtp_forward runs on the model's device) */
    if (!rc) rc = dsv4_seq_new(m, &c->state, err);
    if (!rc && (!(c->logits = malloc(sizeof(float) * (size_t)info.vocab_size)) ||
                !(c->x_last = malloc(sizeof(float) * (size_t)c->hidden_dim))))
        rc = dsv4_fail(err, DSV4_E_NOMEM, "MTP drafter: out of memory");
    if (rc) { mtp_free(c); return rc; }
    *out = (dsv4_drafter){ .name = "mtp", .ctx = c, .propose = mtp_propose, .on_commit = mtp_on_commit, .free = mtp_free,
                           .prefix_save = mtp_prefix_save, .prefix_load = mtp_prefix_load, .prefix_codec = &mtp_codec,
                           .hidden_dim = c->hidden_dim };
    return 0;
}
