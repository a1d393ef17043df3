#include "state/sequence.h"
#include "model/model.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

void rows_release(dsv4_rows *r) {
    if (r->refs && --*r->refs > 0) {
        r->data = NULL;          /* another sequence still uses the buffer */
    } else {
        if (r->mem) r->mem->release(r->data);
        free(r->refs);
    }
    r->data = NULL;
    r->refs = NULL;
    r->cap = r->n = 0;
}

int rows_share(dsv4_rows *dst, dsv4_rows *src) {
    if (!src->refs) {
        if (!(src->refs = malloc(sizeof *src->refs))) return -1;
        *src->refs = 1;
    }
    rows_release(dst);
    *dst = *src;
    ++*src->refs;
    return 0;
}

/* Take a private copy of shared rows (capacity at least n_total). */
static int rows_unshare(dsv4_rows *r, int64_t n_total) {
    if (*r->refs == 1) {         /* the others are gone: the buffer is ours */
        free(r->refs);
        r->refs = NULL;
        return 0;
    }
    int64_t cap = r->cap > n_total ? r->cap : n_total;
    uint8_t *copy = r->mem->alloc((size_t)(cap ? cap : 1) * r->lay.bytes);
    if (!copy) return -1;
    if (r->n) r->mem->copy(copy, r->data, (size_t)r->n * r->lay.bytes);
    --*r->refs;
    r->refs = NULL;
    r->data = copy;
    r->cap = cap;
    return 0;
}

int rows_reserve(dsv4_rows *r, int64_t n_total) {
    if (r->refs && n_total > r->n && rows_unshare(r, n_total)) return -1;
    if (n_total <= r->cap) return 0;
    int64_t nc = r->cap ? r->cap : 16;
    while (nc < n_total) nc *= 2;
    uint8_t *nd = seq_mem_grow(r->mem, r->data, (size_t)r->n * r->lay.bytes, (size_t)nc * r->lay.bytes);
    if (!nd) return -1;
    r->data = nd;
    r->cap = nc;
    return 0;
}

int seq_reserve(struct dsv4_seq *s, int64_t n_more) {
    const int64_t end = s->pos + n_more;
    if (end > s->tokens_cap) {
        int64_t nc = s->tokens_cap ? s->tokens_cap : 64;
        while (nc < end) nc *= 2;
        int32_t *nt = realloc(s->tokens, sizeof(int32_t) * (size_t)nc);
        if (!nt) return -1;
        s->tokens = nt;
        s->tokens_cap = nc;
    }
    for (int L = 0; L < s->n_layers; L++) {
        dsv4_layer_state *ls = &s->layer[L];
        if (ls->comp.kv && rows_reserve(&ls->crows, end / ls->comp.ratio)) return -1;
        if (ls->icomp.kv && rows_reserve(&ls->irows, end / ls->icomp.ratio)) return -1;
    }
    return 0;
}

int seq_fast_forward_zero(struct dsv4_seq *s, int64_t n, dsv4_error *err) {
    if (s->pos != 0) return dsv4_fail(err, DSV4_E_STATE, "fast-forward needs an empty sequence (this one is at %lld)", (long long)s->pos);
    if (n < 0) return dsv4_fail(err, DSV4_E_RANGE, "fast-forward to a negative position");
    if (seq_reserve(s, n))
        return dsv4_fail(err, DSV4_E_NOMEM, "out of %s memory for the rows of a %lld-token context", s->mem->name, (long long)n);
    for (int64_t i = 0; i < n; i++) s->tokens[i] = 0;
    for (int L = 0; L < s->n_layers; L++) {   /* rows past n were never written: the allocations are zero-filled */
        dsv4_layer_state *ls = &s->layer[L];
        if (ls->comp.kv) ls->crows.n = n / ls->comp.ratio;
        if (ls->icomp.kv) ls->irows.n = n / ls->icomp.ratio;
    }
    s->pos = n;
    return DSV4_OK;
}

static void layer_state_free(const seq_mem *mem, dsv4_layer_state *ls) {
    mem->release(ls->ring);
    compressor_state_free(&ls->comp);
    compressor_state_free(&ls->icomp);
    rows_release(&ls->crows);
    rows_release(&ls->irows);
}

void dsv4_seq_free(dsv4_seq *s) {
    if (!s) return;
    if (s->layer)
        for (int L = 0; L < s->n_layers; L++) layer_state_free(s->mem, &s->layer[L]);
    free(s->layer);
    free(s->tokens);
    free(s);
}

int dsv4_seq_new(dsv4_model *m, dsv4_seq **out, dsv4_error *err) {
    return seq_new_in(m, model_state_mem(m), out, err);
}

int seq_new_in(dsv4_model *m, const seq_mem *mem, dsv4_seq **out, dsv4_error *err) {
    const dsv4_config *c = &m->cfg;
    dsv4_seq *s = calloc(1, sizeof *s);
    if (!s) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    s->model = m;
    s->mem = mem;
    s->n_layers = c->n_layers;
    s->ring_len = m->ring_len;
    kv_layout_init(&s->kv_main, m->kv_format, KV_ROW_MAIN, c->head_dim, c->rope_dim);
    kv_layout_init(&s->kv_index, m->kv_format, KV_ROW_INDEX, c->index_head_dim, 0);
    s->layer = calloc((size_t)c->n_layers, sizeof(dsv4_layer_state));
    if (!s->layer) goto oom;
    for (int L = 0; L < c->n_layers; L++) {
        dsv4_layer_state *ls = &s->layer[L];
        const int ratio = c->compress_ratio[L];
        ls->ring = mem->alloc((size_t)s->ring_len * s->kv_main.bytes);
        if (!ls->ring) goto oom;
        ls->crows.lay = s->kv_main;
        ls->irows.lay = s->kv_index;
        ls->crows.mem = ls->irows.mem = mem;
        if (ratio && compressor_state_init(&ls->comp, mem, ratio, c->head_dim, m->max_spec)) goto oom;
        if (ratio == 4 && compressor_state_init(&ls->icomp, mem, 4, c->index_head_dim, m->max_spec)) goto oom;
    }
    *out = s;
    return 0;
oom:
    dsv4_seq_free(s);
    return dsv4_fail(err, DSV4_E_NOMEM, "out of %s memory allocating sequence state", mem->name);
}

int64_t dsv4_seq_position(const dsv4_seq *s) { return s->pos; }
