/* Save / load / restore / fork of a sequence's state. See persist.h for the format. */
#include "state/persist.h"
#include "model/model.h"
#include "state/kvrows.h"
#include "state/sequence.h"
#include "util/error.h"
#include "util/fileio.h"
#include "util/version.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the state format is little-endian; this build writes host order"
#endif

/* Caps that keep every size computation far from 64-bit overflow. */
#define CAP_LAYERS 128u
#define CAP_WIDTH (1u << 16)
#define CAP_WINDOW (1u << 24)
#define CAP_POS ((int64_t)1 << 36)

/* ---- shapes ------------------------------------------------------------------------------------------ */

/* A compressor at position pos needs the projections of positions [live_first, pos) (compressor.h): the
 * current chunk, plus the previous one when overlapping (m = 4). Only those are saved: everything else in the
 * ring is dead, so two states that agree on what the model reads serialise to the same bytes. */
static uint64_t comp_live_positions(uint32_t ratio, int64_t pos) {
    int64_t first = pos - pos % ratio - (ratio == 4 ? 4 : 0);
    return (uint64_t)(pos - (first < 0 ? 0 : first));
}

/* Floats of a compressor state at position pos: kv + score for each live position. */
static uint64_t comp_floats(uint32_t ratio, uint32_t width, int64_t pos) {
    const uint64_t cols = (ratio == 4 ? 2 : 1) * (uint64_t)width;
    return 2 * comp_live_positions(ratio, pos) * cols;
}

static uint64_t live_window(const persist_header *h) {
    return (uint64_t)h->pos < h->window ? (uint64_t)h->pos : h->window;
}

int persist_kv_unpack(uint32_t word, int *fmt, int *rope) {
    *fmt = (int)(word & 0xff);
    *rope = (int)(word >> 8);
    if (!kv_format_name(*fmt)) return -1;
    if (*fmt != DSV4_KV_FP8 && *rope != 0) return -1;   /* only fp8 splits its rows */
    return 0;
}

uint32_t persist_kv_pack(int fmt, int rope) { return (uint32_t)fmt | (fmt == DSV4_KV_FP8 ? (uint32_t)rope << 8 : 0); }

int persist_sizes_of(const persist_header *h, persist_sizes *sz) {
    int fmt, rope;
    if (persist_kv_unpack(h->kv_format, &fmt, &rope) || (uint32_t)rope > h->head_dim) return -1;
    if (h->n_layers == 0 || h->n_layers > CAP_LAYERS || h->head_dim == 0 || h->head_dim > CAP_WIDTH ||
        h->index_head_dim > CAP_WIDTH || h->window == 0 || h->window > CAP_WINDOW || h->pos < 0 || h->pos > CAP_POS)
        return -1;
    memset(sz, 0, sizeof *sz);
    const uint64_t D = h->head_dim, I = h->index_head_dim, pos = (uint64_t)h->pos;
    /* stored bytes of one main (window / compressed) row and one indexer row in the file's KV format */
    const uint64_t MB = kv_row_bytes(fmt, KV_ROW_MAIN, (int)D, rope), IB = kv_row_bytes(fmt, KV_ROW_INDEX, (int)I, 0);
    if (h->version < PERSIST_MIN_VERSION || h->version > PERSIST_VERSION) return -1;
    sz->header = PERSIST_FIXED_BYTES + h->n_layers + (h->version >= 2 ? PERSIST_WRITER_BYTES : 0);
    sz->tokens = 4 * pos;
    sz->total = sz->header + sz->tokens + 8;
    sz->fixed = sz->header + 8;
    sz->per_token = 4;
    for (uint32_t L = 0; L < h->n_layers; L++) {
        const uint32_t r = h->ratio[L];
        if (r != 0 && r != 4 && r != 128) return -1;
        if (r == 4 && I == 0) return -1;
        uint64_t b = live_window(h) * MB;
        sz->fixed += (uint64_t)h->window * MB;
        if (r) {
            const uint64_t fixed = 4 * comp_floats(r, (uint32_t)D, h->pos) + 8;
            b += fixed + (pos / r) * MB;
            sz->fixed += fixed;
            sz->per_token += (double)MB / r;
        }
        if (r == 4) {
            const uint64_t fixed = 4 * comp_floats(4, (uint32_t)I, h->pos) + 8;
            b += fixed + (pos / 4) * IB;
            sz->fixed += fixed;
            sz->per_token += (double)IB / 4;
        }
        sz->layer[L] = b;
        sz->total += b;
    }
    return 0;
}

/* ---- byte cursor --------------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;         /* write target (NULL while reading) */
    const uint8_t *q;   /* read source */
    size_t off, len;
} cursor;

static void put(cursor *c, const void *v, size_t n) {
    if (n) memcpy(c->p + c->off, v, n);   /* v may be NULL when n == 0 (empty history or rows) */
    c->off += n;
}
static void put_u32(cursor *c, uint32_t v) { put(c, &v, 4); }
static void put_u64(cursor *c, uint64_t v) { put(c, &v, 8); }
static void put_i64(cursor *c, int64_t v) { put(c, &v, 8); }

/* Reads are bounds-checked even though the length was validated first: a bug here must not read past. */
static int get(cursor *c, void *v, size_t n) {
    if (n > c->len - c->off) return -1;
    if (v && n) memcpy(v, c->q + c->off, n);
    c->off += n;
    return 0;
}
static uint32_t get_u32(cursor *c) { uint32_t v = 0; get(c, &v, 4); return v; }

/* The same for bytes of a sequence's state, which may live in device memory (statemem.h). */
static void put_state(cursor *c, const seq_mem *mem, const void *v, size_t n) {
    if (n) mem->to_host(c->p + c->off, v, n);
    c->off += n;
}
static int get_state(cursor *c, const seq_mem *mem, void *v, size_t n) {
    if (n > c->len - c->off) return -1;
    if (v && n) mem->from_host(v, c->q + c->off, n);
    c->off += n;
    return 0;
}
static uint64_t get_u64(cursor *c) { uint64_t v = 0; get(c, &v, 8); return v; }

/* ---- save ------------------------------------------------------------------------------------------------ */

static void header_of(const dsv4_seq *s, persist_header *h) {
    const dsv4_model *m = s->model;
    memset(h, 0, sizeof *h);
    h->version = PERSIST_VERSION;
    h->mode = (uint32_t)m->mode;
    h->kv_format = persist_kv_pack(s->kv_main.fmt, s->kv_main.rope);
    h->fingerprint = m->fingerprint;
    h->n_layers = (uint32_t)s->n_layers;
    h->head_dim = (uint32_t)m->cfg.head_dim;
    h->index_head_dim = (uint32_t)m->cfg.index_head_dim;
    h->window = (uint32_t)m->cfg.window;
    h->ring_len = (uint32_t)s->ring_len;
    h->pos = s->pos;
    for (int L = 0; L < s->n_layers; L++) h->ratio[L] = (uint8_t)m->cfg.compress_ratio[L];
    snprintf(h->writer, sizeof h->writer, "%s", dsv4_build_writer());
}

const int32_t *dsv4_seq_tokens(const dsv4_seq *s) { return s->tokens; }

size_t dsv4_seq_state_bytes(const dsv4_seq *s) {
    persist_header h;
    persist_sizes sz;
    header_of(s, &h);
    return persist_sizes_of(&h, &sz) ? 0 : (size_t)sz.total;
}

static void put_comp(cursor *c, const dsv4_compressor_state *cs, int64_t pos) {
    const size_t n = (size_t)cs->cols * sizeof(float);
    for (int64_t t = compressor_live_first(cs, pos); t < pos; t++) put_state(c, cs->mem, compressor_kv_at(cs, t), n);
    for (int64_t t = compressor_live_first(cs, pos); t < pos; t++) put_state(c, cs->mem, compressor_score_at(cs, t), n);
}

static void put_rows(cursor *c, const dsv4_rows *r) {
    put_i64(c, r->n);
    put_state(c, r->mem, r->data, (size_t)r->n * r->lay.bytes);
}

static void put_layer(cursor *c, const dsv4_seq *s, const dsv4_layer_state *ls, const persist_header *h) {
    const int64_t nwin = (int64_t)live_window(h);
    for (int64_t t = s->pos - nwin; t < s->pos; t++) put_state(c, s->mem, seq_ring_at(s, ls, t), s->kv_main.bytes);
    if (ls->comp.kv) {
        put_comp(c, &ls->comp, s->pos);
        put_rows(c, &ls->crows);
    }
    if (ls->icomp.kv) {
        put_comp(c, &ls->icomp, s->pos);
        put_rows(c, &ls->irows);
    }
}

int dsv4_seq_save_mem(const dsv4_seq *s, void **buf, size_t *len, dsv4_error *err) {
    if (!s || !buf || !len) return dsv4_fail(err, DSV4_E_ARG, "save: missing sequence or output");
    persist_header h;
    persist_sizes sz;
    header_of(s, &h);
    if (persist_sizes_of(&h, &sz)) return dsv4_fail(err, DSV4_E_STATE, "save: the model's shapes exceed what the state format holds");
    if (sz.total > SIZE_MAX) return dsv4_fail(err, DSV4_E_NOMEM, "save: state too large for this machine");
    cursor c = { malloc((size_t)sz.total), NULL, 0, (size_t)sz.total };
    if (!c.p) return dsv4_fail(err, DSV4_E_NOMEM, "save: out of memory for %llu bytes of state", (unsigned long long)sz.total);
    put(&c, PERSIST_MAGIC, 8);
    put_u32(&c, h.version);
    put_u32(&c, h.mode);
    put_u64(&c, h.fingerprint);
    put_u32(&c, h.kv_format);
    put_u32(&c, h.n_layers);
    put_u32(&c, h.head_dim);
    put_u32(&c, h.index_head_dim);
    put_u32(&c, h.window);
    put_u32(&c, h.ring_len);
    put_i64(&c, h.pos);
    put(&c, h.ratio, h.n_layers);
    char writer[PERSIST_WRITER_BYTES] = {0};   /* NUL-padded: the file's bytes do not depend on stack contents */
    memcpy(writer, h.writer, strnlen(h.writer, PERSIST_WRITER_BYTES));
    put(&c, writer, PERSIST_WRITER_BYTES);
    put(&c, s->tokens, sizeof(int32_t) * (size_t)s->pos);
    for (int L = 0; L < s->n_layers; L++) put_layer(&c, s, &s->layer[L], &h);
    put_u64(&c, XXH64(c.p, c.off, 0));
    if (c.off != c.len) {   /* the size formula and the writer disagree: a bug, never user input */
        free(c.p);
        return dsv4_fail(err, DSV4_E_STATE, "save: internal size mismatch (%zu vs %zu bytes)", c.off, c.len);
    }
    *buf = c.p;
    *len = c.len;
    return 0;
}

int dsv4_seq_save(const dsv4_seq *s, const char *path, dsv4_error *err) {
    void *buf;
    size_t len;
    int rc = dsv4_seq_save_mem(s, &buf, &len, err);
    if (rc) return rc;
    rc = dsv4_write_file_atomic(path, buf, len, err);
    free(buf);
    return rc;
}

/* ---- read and validate ------------------------------------------------------------------------------------ */

/* The writer field: printable ASCII, then NUL padding only. */
static int read_writer(cursor *c, persist_header *h) {
    char w[PERSIST_WRITER_BYTES];
    if (get(c, w, sizeof w)) return -1;
    size_t n = strnlen(w, sizeof w);
    for (size_t i = 0; i < sizeof w; i++)
        if (i < n ? (w[i] < 0x20 || w[i] > 0x7e) : w[i] != 0) return -1;
    memcpy(h->writer, w, n);
    h->writer[n] = 0;
    return 0;
}

int persist_read_header(const void *buf, size_t len, persist_header *h, dsv4_error *err) {
    cursor c = { NULL, buf, 0, len };
    memset(h, 0, sizeof *h);
    if (!buf || len < 12) return dsv4_fail(err, DSV4_E_FORMAT, "state is truncated: %zu bytes, not even a header", len);
    if (memcmp(buf, PERSIST_MAGIC, 8)) return dsv4_fail(err, DSV4_E_FORMAT, "not a dsv4 sequence state (bad magic)");
    c.off = 8;
    h->version = get_u32(&c);
    if (h->version < PERSIST_MIN_VERSION || h->version > PERSIST_VERSION)
        return dsv4_fail(err, DSV4_E_FORMAT, "state format version %u is not supported (this build reads versions %u to %u)",
                         h->version, PERSIST_MIN_VERSION, PERSIST_VERSION);
    if (len < PERSIST_FIXED_BYTES)
        return dsv4_fail(err, DSV4_E_FORMAT, "state is truncated: %zu bytes, the header alone needs %d", len, PERSIST_FIXED_BYTES);
    h->mode = get_u32(&c);
    h->fingerprint = get_u64(&c);
    h->kv_format = get_u32(&c);
    h->n_layers = get_u32(&c);
    h->head_dim = get_u32(&c);
    h->index_head_dim = get_u32(&c);
    h->window = get_u32(&c);
    h->ring_len = get_u32(&c);
    h->pos = (int64_t)get_u64(&c);
    if (h->n_layers == 0 || h->n_layers > CAP_LAYERS)
        return dsv4_fail(err, DSV4_E_FORMAT, "state header: %u layers is out of range (corrupted?)", h->n_layers);
    if (get(&c, h->ratio, h->n_layers))
        return dsv4_fail(err, DSV4_E_FORMAT, "state is truncated inside its header (%zu bytes)", len);
    if (h->version >= 2 && read_writer(&c, h))
        return dsv4_fail(err, DSV4_E_FORMAT, "state header: the writer field is truncated or not printable text (corrupted?)");
    int kv_fmt, kv_rope;
    if (persist_kv_unpack(h->kv_format, &kv_fmt, &kv_rope))
        return dsv4_fail(err, DSV4_E_FORMAT, "state KV storage word 0x%x is unknown (this build has f32 = 0, bf16 = 1, "
                         "fp8 = 2 | rope dims << 8)", h->kv_format);
    persist_sizes sz;
    if (persist_sizes_of(h, &sz))
        return dsv4_fail(err, DSV4_E_FORMAT, "state header has out-of-range shapes or position (corrupted?)");
    if (len < sz.total)
        return dsv4_fail(err, DSV4_E_FORMAT, "state is truncated: %zu bytes, its header implies %llu", len, (unsigned long long)sz.total);
    if (len > sz.total)
        return dsv4_fail(err, DSV4_E_FORMAT, "state has %llu bytes of trailing garbage after its checksum",
                         (unsigned long long)(len - sz.total));
    uint64_t stored;
    memcpy(&stored, (const uint8_t *)buf + len - 8, 8);
    if (XXH64(buf, len - 8, 0) != stored) return dsv4_fail(err, DSV4_E_FORMAT, "state checksum mismatch: the data is corrupted");
    return 0;
}

/* The header must describe this model exactly. */
static int check_against_model(const persist_header *h, const dsv4_model *m, dsv4_error *err) {
    const dsv4_config *c = &m->cfg;
    if (h->kv_format != persist_kv_pack(m->kv_format, c->rope_dim)) {
        int fmt, rope;
        persist_kv_unpack(h->kv_format, &fmt, &rope);
        return dsv4_fail(err, DSV4_E_STATE, "state stores its KV cache as %s, the model was loaded with --kv %s "
                         "(load it with the same KV format to restore this state)", kv_format_name(fmt),
                         kv_format_name(m->kv_format));
    }
    if (h->fingerprint != m->fingerprint)
        return dsv4_fail(err, DSV4_E_STATE, "state belongs to another model (fingerprint %016llx, this model %016llx)",
                         (unsigned long long)h->fingerprint, (unsigned long long)m->fingerprint);
    if (h->mode != (uint32_t)m->mode)
        return dsv4_fail(err, DSV4_E_STATE, "state was computed in numeric mode %s, the model runs in %s",
                         h->mode == DSV4_MODE_EXACT ? "exact" : h->mode == DSV4_MODE_OFFICIAL ? "official" : "unknown",
                         m->mode == DSV4_MODE_EXACT ? "exact" : "official");
    if (h->n_layers != (uint32_t)c->n_layers || h->head_dim != (uint32_t)c->head_dim ||
        h->index_head_dim != (uint32_t)c->index_head_dim || h->window != (uint32_t)c->window)
        return dsv4_fail(err, DSV4_E_STATE, "state shapes (%u layers, head_dim %u, index_head_dim %u, window %u) do not match the model's",
                         h->n_layers, h->head_dim, h->index_head_dim, h->window);
    for (uint32_t L = 0; L < h->n_layers; L++)
        if (h->ratio[L] != c->compress_ratio[L])
            return dsv4_fail(err, DSV4_E_STATE, "state layer %u has compress ratio %u, the model's is %d", L, h->ratio[L],
                             c->compress_ratio[L]);
    if (h->pos > c->max_position)
        return dsv4_fail(err, DSV4_E_STATE, "state position %lld exceeds the model's maximum of %lld",
                         (long long)h->pos, (long long)c->max_position);
    return 0;
}

/* Walk the body after the header. With s == NULL only check what the checksum cannot: token ids and the
 * stored row counts (a file written by a buggy or foreign writer with a valid checksum); with s, copy every
 * field into s (already shaped and reserved for h->pos tokens). */
static int walk_body(cursor *c, const persist_header *h, const dsv4_model *m, dsv4_seq *s, dsv4_error *err) {
    const int64_t pos = h->pos, nwin = (int64_t)live_window(h);
    const size_t D = h->head_dim, I = h->index_head_dim;
    int fmt, rope;
    persist_kv_unpack(h->kv_format, &fmt, &rope);   /* validated by persist_read_header */
    for (int64_t t = 0; t < pos; t++) {
        int32_t tok = 0;
        get(c, &tok, 4);
        if (!s && (tok < 0 || tok >= m->cfg.vocab_size))
            return dsv4_fail(err, DSV4_E_STATE, "state token %lld is %d, outside the vocabulary (0..%d)", (long long)t, tok,
                             m->cfg.vocab_size - 1);
        if (s) s->tokens[t] = tok;
    }
    for (uint32_t L = 0; L < h->n_layers; L++) {
        const int r = h->ratio[L];
        dsv4_layer_state *ls = s ? &s->layer[L] : NULL;
        for (int64_t t = pos - nwin; t < pos; t++)
            get_state(c, s ? s->mem : NULL, ls ? seq_ring_at(s, ls, t) : NULL, kv_row_bytes(fmt, KV_ROW_MAIN, (int)D, rope));
        for (int which = 0; which < 2; which++) {
            if (which == 0 ? !r : r != 4) continue;
            const size_t width = which ? I : D;
            const uint32_t ratio = which ? 4 : (uint32_t)r;
            dsv4_compressor_state *cs = ls ? (which ? &ls->icomp : &ls->comp) : NULL;
            dsv4_rows *rows = ls ? (which ? &ls->irows : &ls->crows) : NULL;
            const int64_t first = pos - (int64_t)comp_live_positions(ratio, pos);
            const size_t row = (ratio == 4 ? 2 : 1) * width * sizeof(float);
            for (int64_t t = first; t < pos; t++) get_state(c, cs ? cs->mem : NULL, cs ? compressor_kv_at(cs, t) : NULL, row);
            for (int64_t t = first; t < pos; t++) get_state(c, cs ? cs->mem : NULL, cs ? compressor_score_at(cs, t) : NULL, row);
            const int64_t n = (int64_t)get_u64(c);
            if (n != pos / ratio)
                return dsv4_fail(err, DSV4_E_STATE, "state layer %u stores %lld %s rows, position %lld implies %lld", L,
                                 (long long)n, which ? "indexer" : "compressed", (long long)pos, (long long)(pos / ratio));
            get_state(c, rows ? rows->mem : NULL, rows ? rows->data : NULL, (size_t)n * kv_row_bytes(fmt, which ? KV_ROW_INDEX : KV_ROW_MAIN, (int)width, rope));
            if (rows) rows->n = n;
        }
    }
    return 0;
}

/* Load into a new sequence; validation completes before anything is allocated. */
static int load_mem(const dsv4_model *m, const seq_mem *mem, const void *buf, size_t len, dsv4_seq **out, dsv4_error *err) {
    persist_header h;
    int rc = persist_read_header(buf, len, &h, err);
    if (rc) return rc;
    if ((rc = check_against_model(&h, m, err))) return rc;
    persist_sizes sz;
    persist_sizes_of(&h, &sz);
    cursor c = { NULL, buf, (size_t)sz.header, len - 8 };
    if ((rc = walk_body(&c, &h, m, NULL, err))) return rc;
    dsv4_seq *s;
    /* seq_new_in takes a mutable model only because sequences hand it to dsv4_step later */
    if ((rc = seq_new_in((dsv4_model *)m, mem, &s, err))) return rc;
    if (seq_reserve(s, h.pos)) {
        dsv4_seq_free(s);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory for a state of %lld tokens", (long long)h.pos);
    }
    c.off = (size_t)sz.header;
    walk_body(&c, &h, m, s, err);
    s->pos = h.pos;
    *out = s;
    return 0;
}

int dsv4_seq_load_mem(dsv4_model *m, const void *buf, size_t len, dsv4_seq **out, dsv4_error *err) {
    if (!m || !out) return dsv4_fail(err, DSV4_E_ARG, "load: missing model or output");
    return load_mem(m, model_state_mem(m), buf, len, out, err);
}

int dsv4_seq_load(dsv4_model *m, const char *path, dsv4_seq **out, dsv4_error *err) {
    char *buf;
    size_t len;
    int rc = dsv4_read_file(path, &buf, &len, err);
    if (rc) return rc;
    rc = dsv4_seq_load_mem(m, buf, len, out, err);
    free(buf);
    if (rc) dsv4_wrap(err, "%s", path);
    return rc;
}

/* Exchange the contents of two sequences of the same model (the handles stay where the caller has them). */
static void seq_swap(dsv4_seq *a, dsv4_seq *b) {
    dsv4_seq t = *a;
    *a = *b;
    *b = t;
}

int dsv4_seq_restore_mem(dsv4_seq *s, const void *buf, size_t len, dsv4_error *err) {
    if (!s) return dsv4_fail(err, DSV4_E_ARG, "restore: missing sequence");
    dsv4_seq *n;
    int rc = load_mem(s->model, s->mem, buf, len, &n, err);
    if (rc) return rc;
    seq_swap(s, n);
    dsv4_seq_free(n);
    return 0;
}

int dsv4_seq_restore(dsv4_seq *s, const char *path, dsv4_error *err) {
    char *buf;
    size_t len;
    int rc = dsv4_read_file(path, &buf, &len, err);
    if (rc) return rc;
    rc = dsv4_seq_restore_mem(s, buf, len, err);
    free(buf);
    if (rc) dsv4_wrap(err, "%s", path);
    return rc;
}

/* ---- fork ------------------------------------------------------------------------------------------------ */

/* The fixed states (ring, compressor states) are copied; the append-only rows are shared copy-on-write
 * (sequence.h): a fork costs the fixed state, whatever the context length. Sharing updates the parent's
 * reference bookkeeping only, never a row it reads, hence the cast of its const. */
int dsv4_seq_fork(const dsv4_seq *s, dsv4_seq **out, dsv4_error *err) {
    if (!s || !out) return dsv4_fail(err, DSV4_E_ARG, "fork: missing sequence or output");
    dsv4_seq *f;
    int rc = seq_new_in((dsv4_model *)s->model, s->mem, &f, err);
    if (rc) return rc;
    if (seq_reserve(f, s->pos)) {
        dsv4_seq_free(f);
        return dsv4_fail(err, DSV4_E_NOMEM, "fork: out of memory for %lld tokens of state", (long long)s->pos);
    }
    if (s->pos) memcpy(f->tokens, s->tokens, sizeof(int32_t) * (size_t)s->pos);
    for (int L = 0; L < s->n_layers; L++) {
        const dsv4_layer_state *a = &s->layer[L];
        dsv4_layer_state *b = &f->layer[L];
        s->mem->copy(b->ring, a->ring, (size_t)s->ring_len * s->kv_main.bytes);
        int shared = 0;
        if (a->comp.kv) {
            compressor_state_copy(&b->comp, &a->comp);
            shared |= rows_share(&b->crows, (dsv4_rows *)&a->crows);
        }
        if (a->icomp.kv) {
            compressor_state_copy(&b->icomp, &a->icomp);
            shared |= rows_share(&b->irows, (dsv4_rows *)&a->irows);
        }
        if (shared) {
            dsv4_seq_free(f);
            return dsv4_fail(err, DSV4_E_NOMEM, "fork: out of memory");
        }
    }
    f->pos = s->pos;
    *out = f;
    return 0;
}
