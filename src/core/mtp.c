#include "core/mtp.h"
#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "core/forward.h"
#include "core/norm.h"
#include "core/numerics.h"
#include "model/model.h"
#include "state/sequence.h"
#include "util/error.h"
#include <string.h>

int dsv4_model_has_mtp(const dsv4_model *m) { return m->mtp != NULL; }

/* FP8 linear over n rows: OFFICIAL quantizes the input rows per 128 columns and rounds the output to bf16. */
static void fp8_linear_rows(dsv4_model *m, const dsv4_weight *w, float *x, int n, float *y) {
    const int d = m->cfg.dim;
    if (is_official(m->mode))
        for (int t = 0; t < n; t++) act_quant_fp8_inplace(x + (int64_t)t * d, d, 128);
    linear_bf16_in(m->dots, m->pool, w, x, n, d, y, w->rows);
    num_bf16(m->mode, y, (long)n * w->rows);
}

/* ws->X <- X' for every row: the embedding of the next token mixed into each stream of the target state. */
static void mtp_input(dsv4_model *m, const dsv4_mtp_head *h, const float *X, const int32_t *next, int n) {
    dsv4_workspace *ws = m->ws;
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, hc = c->hc_mult;
    for (int t = 0; t < n; t++) {
        float *e = ws->xn + (int64_t)t * d;
        weight_decode_row(&m->embed, next[t], e);
        rmsnorm(m->mode, e, h->enorm, d, c->norm_eps, e);
        for (int s = 0; s < hc; s++) {
            const float *xs = X + ((int64_t)t * hc + s) * d;
            rmsnorm(m->mode, xs, h->hnorm, d, c->norm_eps, ws->ex + ((int64_t)t * hc + s) * d);
        }
    }
    fp8_linear_rows(m, &h->e_proj, ws->xn, n, ws->sub);        /* [n][d] */
    fp8_linear_rows(m, &h->h_proj, ws->ex, n * hc, ws->ey);    /* [n*hc][d] */
    for (int t = 0; t < n; t++)
        for (int s = 0; s < hc; s++) {
            float *out = ws->X + ((int64_t)t * hc + s) * d;
            const float *ep = ws->sub + (int64_t)t * d, *hp = ws->ey + ((int64_t)t * hc + s) * d;
            for (int k = 0; k < d; k++) out[k] = num_bf16_1(m->mode, ep[k] + hp[k]);
        }
}

int dsv4_mtp_forward(dsv4_model *m, dsv4_seq *state, const float *X, const int32_t *next_tokens, int n,
                     dsv4_logits_want want, float *logits, dsv4_error *err) {
    if (!m->mtp) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "this checkpoint has no V4 MTP head (mtp.0.e_proj)");
    if (m->cuda) return cuda_mtp_forward(m, state, X, next_tokens, n, want, logits, err);
    if (!X) return dsv4_fail(err, DSV4_E_ARG, "MTP: missing target hidden states");
    dsv4_step_item it = { state, next_tokens, n, want, logits, NULL };
    /* the per-token scratch must hold hc rows per token for the stream projections */
    int rc = forward_begin(m, &it, 1, m->cfg.hc_mult, err);
    if (rc) return dsv4_wrap(err, "MTP");
    mtp_input(m, m->mtp, X, next_tokens, n);
    block_forward(m, &m->mtp->block, 0, m->ws);
    forward_finish(m, &m->mtp->hc_head, m->mtp->norm);
    return 0;
}
