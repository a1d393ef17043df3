/* Vocabulary trie for constrained decoding: see constraint_vocab.h. */
#define _GNU_SOURCE /* qsort_r */
#include "engine/constraint_vocab.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

/* Tokens longer than this are never allowed inside constrained output (no real BPE token comes close). */
#define MAX_TOKEN_BYTES 1024

void dsv4_cvocab_free(dsv4_cvocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->len);
    free(v->pool);
    free(v->byte);
    free(v->depth);
    free(v->end);
    free(v->tok_first);
    free(v->toks);
    free(v->depth_nodes);
    free(v->len_le);
    free(v->has_byte);
    free(v->tok_index);
    sig_shelf_free(v->shelf);
    count_shelf_free(v->count_shelf);
    for (int32_t i = 0; i < v->n_special; i++) free(v->special_text[i]);
    free(v->special_text);
    free(v->special_id);
    free(v);
}

int32_t dsv4_cvocab_size(const dsv4_cvocab *v) { return v->n_vocab; }
int32_t dsv4_cvocab_eos(const dsv4_cvocab *v) { return v->eos; }
const char *dsv4_cvocab_bytes(const dsv4_cvocab *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n_vocab || !v->bytes[id]) return NULL;
    if (len) *len = v->len[id];
    return v->bytes[id];
}

static int by_bytes(const void *a, const void *b, void *ctx) {
    const dsv4_cvocab *v = ctx;
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const uint32_t n = v->len[i] < v->len[j] ? v->len[i] : v->len[j];
    const int c = memcmp(v->bytes[i], v->bytes[j], n);
    if (c) return c;
    if (v->len[i] != v->len[j]) return v->len[i] < v->len[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* Build the preorder trie from the tokens sorted by their bytes: each token shares its longest common prefix
 * with the one before it, so nodes are created (and subtrees closed) in one pass. */
static int build_trie(dsv4_cvocab *v) {
    int32_t n_tok = 0;
    size_t total = 1;
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (v->bytes[i]) { n_tok++; total += v->len[i]; }
    int32_t *ids = malloc(sizeof *ids * (size_t)(n_tok + 1));
    v->toks = malloc(sizeof *v->toks * (size_t)(n_tok + 1));
    v->byte = malloc(total);
    v->depth = malloc(sizeof *v->depth * total);
    v->end = malloc(sizeof *v->end * total);
    v->tok_first = malloc(sizeof *v->tok_first * (total + 1));
    if (!ids || !v->toks || !v->byte || !v->depth || !v->end || !v->tok_first) { free(ids); return -1; }
    n_tok = 0;
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (v->bytes[i]) ids[n_tok++] = i;
    qsort_r(ids, (size_t)n_tok, sizeof *ids, by_bytes, v);
    int32_t path[MAX_TOKEN_BYTES + 1];
    int cur = 0;               /* depth of the path */
    int32_t n = 1, nt = 0;
    v->byte[0] = 0;
    v->depth[0] = 0;
    v->tok_first[0] = 0;
    path[0] = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t k = 0; k < n_tok; k++) {
        const int32_t id = ids[k];
        const char *s = v->bytes[id];
        const uint32_t L = v->len[id];
        uint32_t lcp = 0;
        while (prev && lcp < L && lcp < prev_len && s[lcp] == prev[lcp]) lcp++;
        for (int d = cur; d > (int)lcp; d--) v->end[path[d]] = n;
        for (uint32_t d = lcp + 1; d <= L; d++) {
            v->byte[n] = (uint8_t)s[d - 1];
            v->depth[n] = (uint16_t)d;
            v->tok_first[n] = nt;
            path[d] = n++;
        }
        cur = (int)L;
        v->toks[nt++] = id;  /* ends at path[L], the node created last (sorted order) */
        if ((int)L > v->max_depth) v->max_depth = (int)L;
        prev = s;
        prev_len = L;
    }
    for (int d = cur; d >= 0; d--) v->end[path[d]] = n;
    v->tok_first[n] = nt;
    v->n_node = n;
    free(ids);
    return 0;
}

/* The layers of the trie (depth 1 .. CV_SIG_DEPTH) and the token-length sets: what a walk that reuses another
 * walk's first d layers needs (constraint_sig.c). */
static int build_layers(dsv4_cvocab *v) {
    const size_t words = (size_t)(v->n_vocab + 63) / 64;
    memset(v->depth_first, 0, sizeof v->depth_first);
    for (int32_t i = 1; i < v->n_node; i++)
        if (v->depth[i] <= CV_SIG_DEPTH) v->depth_first[v->depth[i] + 1]++;
    for (int d = 1; d <= CV_SIG_DEPTH + 1; d++) v->depth_first[d] += v->depth_first[d - 1];
    v->depth_nodes = malloc(sizeof *v->depth_nodes * (size_t)(v->depth_first[CV_SIG_DEPTH + 1] + 1));
    v->len_le = calloc((CV_SIG_DEPTH + 1) * words, sizeof *v->len_le);
    if (!v->depth_nodes || !v->len_le) return -1;
    int32_t at[CV_SIG_DEPTH + 2];
    memcpy(at, v->depth_first, sizeof at);
    for (int32_t i = 1; i < v->n_node; i++)
        if (v->depth[i] <= CV_SIG_DEPTH) v->depth_nodes[at[v->depth[i]]++] = i;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->bytes[id])
            for (uint32_t d = v->len[id]; d <= CV_SIG_DEPTH; d++) v->len_le[d * words + (size_t)(id >> 6)] |= 1ULL << (id & 63);
    /* each token's bytes as a set, and its place in toks */
    v->has_byte = calloc((256 + 3) * words, sizeof *v->has_byte);
    v->tok_index = malloc(sizeof *v->tok_index * (size_t)v->n_vocab);
    if (!v->has_byte || !v->tok_index) return -1;
    for (int32_t id = 0; id < v->n_vocab; id++) v->tok_index[id] = -1;
    for (int32_t k = 0; k < v->tok_first[v->n_node]; k++) {
        const int32_t id = v->toks[k];
        v->tok_index[id] = k;
        const unsigned char *p = (const unsigned char *)v->bytes[id];
        const uint64_t bit = 1ULL << (id & 63);
        for (uint32_t i = 0; i < v->len[id]; i++) {
            v->has_byte[p[i] * words + (size_t)(id >> 6)] |= bit;
            if (p[i] >= 0x80) v->has_byte[256 * words + (size_t)(id >> 6)] |= bit;
            if (p[i] < 0x20 || p[i] == 0x7F) v->has_byte[257 * words + (size_t)(id >> 6)] |= bit;
        }
        if (v->len[id]) v->has_byte[258 * words + (size_t)(id >> 6)] |= bit;
    }
    return 0;
}

int dsv4_cvocab_new(const char *const *bytes, const size_t *lens, int32_t n_vocab, int32_t eos_id, dsv4_cvocab **out,
                    dsv4_error *err) {
    *out = NULL;
    if (n_vocab <= 0) return dsv4_fail(err, DSV4_E_ARG, "constraint: empty vocabulary");
    if (eos_id < 0 || eos_id >= n_vocab)
        return dsv4_fail(err, DSV4_E_ARG, "constraint: end-of-sequence id %d is outside the vocabulary (%d)", eos_id, n_vocab);
    dsv4_cvocab *v = calloc(1, sizeof *v);
    if (!v) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
    v->n_vocab = n_vocab;
    v->eos = eos_id;
    size_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (bytes[i] && lens[i] > 0 && lens[i] <= MAX_TOKEN_BYTES && i != eos_id) total += lens[i];
    v->bytes = calloc((size_t)n_vocab, sizeof *v->bytes);
    v->len = calloc((size_t)n_vocab, sizeof *v->len);
    v->pool = malloc(total + 1);
    if (!v->bytes || !v->len || !v->pool) { dsv4_cvocab_free(v); return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory"); }
    size_t at = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (!bytes[i] || lens[i] == 0 || lens[i] > MAX_TOKEN_BYTES || i == eos_id) continue;
        memcpy(v->pool + at, bytes[i], lens[i]);
        v->bytes[i] = v->pool + at;
        v->len[i] = (uint32_t)lens[i];
        at += lens[i];
    }
    if (build_trie(v) || build_layers(v)) { dsv4_cvocab_free(v); return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory"); }
    *out = v;
    return 0;
}

int dsv4_cvocab_from_tokenizer(const dsv4_tokenizer *t, int32_t n_vocab, int32_t eos_id, dsv4_cvocab **out,
                               dsv4_error *err) {
    *out = NULL;
    if (n_vocab <= 0) return dsv4_fail(err, DSV4_E_ARG, "constraint: empty vocabulary");
    const char **b = calloc((size_t)n_vocab, sizeof *b);
    size_t *l = calloc((size_t)n_vocab, sizeof *l);
    if (!b || !l) { free(b); free(l); return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory"); }
    const int32_t tv = dsv4_tokenizer_vocab_size(t);
    for (int32_t i = 0; i < n_vocab && i < tv; i++) {
        if (dsv4_tokenizer_is_added(t, i)) continue; /* special tokens appear only where a grammar names them */
        b[i] = dsv4_tokenizer_token_bytes(t, i, &l[i]);
    }
    int rc = dsv4_cvocab_new(b, l, n_vocab, eos_id, out, err);
    if (!rc && (rc = dsv4_cvocab_prepare_json(*out, err))) { dsv4_cvocab_free(*out); *out = NULL; }
    for (int32_t i = 0; !rc && i < n_vocab && i < tv; i++) {
        if (!dsv4_tokenizer_is_added(t, i) || i == eos_id) continue;
        size_t n;
        const char *text = dsv4_tokenizer_token_bytes(t, i, &n);
        if (text && n > 0 && (rc = dsv4_cvocab_add_special(*out, text, n, i, err))) {
            dsv4_cvocab_free(*out);
            *out = NULL;
        }
    }
    free(b);
    free(l);
    return rc;
}

int dsv4_cvocab_add_special(dsv4_cvocab *v, const char *text, size_t n, int32_t id, dsv4_error *err) {
    if (id < 0 || id >= v->n_vocab || id == v->eos || v->bytes[id])
        return dsv4_fail(err, DSV4_E_ARG, "constraint: special token id %d is not a free id of the vocabulary", id);
    if (v->n_special == v->cap_special) {
        const int32_t c = v->cap_special ? 2 * v->cap_special : 16;
        char **t = realloc(v->special_text, sizeof *t * (size_t)c);
        if (t) v->special_text = t;
        int32_t *d = realloc(v->special_id, sizeof *d * (size_t)c);
        if (d) v->special_id = d;
        if (!t || !d) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
        v->cap_special = c;
    }
    char *s = malloc(n + 1);
    if (!s) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
    memcpy(s, text, n);
    s[n] = 0;
    v->special_text[v->n_special] = s;
    v->special_id[v->n_special++] = id;
    return 0;
}

int32_t dsv4_cvocab_special_id(const dsv4_cvocab *v, const char *text) {
    for (int32_t i = 0; i < v->n_special; i++)
        if (!strcmp(v->special_text[i], text)) return v->special_id[i];
    return -1;
}
