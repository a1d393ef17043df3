#include "text/tokenizer.h"
#include "text/bpe.h"
#include "text/bytemap.h"
#include "text/hashmap.h"
#include "text/pretok.h"
#include "text/utf8.h"
#include "util/error.h"
#include "util/fileio.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Trie over added-token contents, for leftmost-longest matching. Children are a sibling list: the table is small
 * (about 1,300 entries) and most nodes have one child, so this is compact and fast enough. */
typedef struct {
    int32_t child;    /* first child node, -1 = none */
    int32_t sibling;  /* next sibling, -1 = none */
    int32_t token;    /* added-token id ending here, -1 = none */
    unsigned char byte;
} trie_node;

struct dsv4_tokenizer {
    int32_t  n_vocab;        /* highest id + 1 */
    char   **tok_str;        /* per id: stored string (byte-level alphabet, or added-token content); may be NULL */
    uint32_t *tok_len;
    char    *str_pool;       /* owns every tok_str */
    char   **dec;            /* per id: decoded bytes (added tokens literal), NULL = no such id */
    uint32_t *dec_len;
    char    *dec_pool;
    uint8_t *is_added;       /* per id */
    dsv4_strmap vocab;       /* byte-level string -> id (model vocabulary) */
    dsv4_strmap added;       /* added-token content -> id */
    int      n_added;
    dsv4_pairmap merges;
    int      n_merges;
    int32_t  byte_id[256];
    dsv4_pretok *pretok;
    trie_node *trie;
    int32_t  trie_n, trie_cap;
    uint8_t  first_byte[256]; /* 1 when some added token starts with this byte */
    int      add_bos;
    int32_t  bos_id, eos_id;
};

/* ---------------------------------------------------------------- loading helpers */

static int trie_add(dsv4_tokenizer *t, const char *s, size_t n, int32_t id) {
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != b) c = t->trie[c].sibling;
        if (c < 0) {
            if (t->trie_n == t->trie_cap) {
                int32_t cap = t->trie_cap * 2;
                trie_node *p = realloc(t->trie, (size_t)cap * sizeof *p);
                if (!p) return -1;
                t->trie = p;
                t->trie_cap = cap;
            }
            c = t->trie_n++;
            t->trie[c] = (trie_node){-1, t->trie[node].child, -1, b};
            t->trie[node].child = c;
        }
        node = c;
    }
    t->trie[node].token = id;
    return 0;
}

/* Length of the longest added token starting at s, 0 if none. */
static size_t trie_longest(const dsv4_tokenizer *t, const unsigned char *s, size_t n, int32_t *id) {
    int32_t node = 0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != s[i]) c = t->trie[c].sibling;
        if (c < 0) break;
        node = c;
        if (t->trie[node].token >= 0) { best = i + 1; *id = t->trie[node].token; }
    }
    return best;
}

static const char *json_str_field(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* GPT-2's pre-tokenizer regex, used when a ByteLevel pre-tokenizer has use_regex=true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_pretokenizer(dsv4_tokenizer *t, json_t *pt, dsv4_error *err) {
    if (!pt || json_is_null(pt)) return 0;
    const char *type = json_str_field(pt, "type");
    if (!type) return dsv4_fail(err, DSV4_E_FORMAT, "pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list)) return dsv4_fail(err, DSV4_E_FORMAT, "pre_tokenizer Sequence without a list");
        size_t i;
        json_t *item;
        json_array_foreach(list, i, item) {
            int rc = add_pretokenizer(t, item, err);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(pt, "pattern");
        const char *behavior = json_str_field(pt, "behavior");
        if (!behavior || strcmp(behavior, "Isolated") || json_is_true(json_object_get(pt, "invert")))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "pre_tokenizer Split: only behavior Isolated without invert "
                                                      "is supported (got %s)", behavior ? behavior : "none");
        const char *re = json_str_field(pat, "Regex");
        if (re) return dsv4_pretok_add_split(t->pretok, re, err);
        const char *lit = json_str_field(pat, "String");
        if (!lit) return dsv4_fail(err, DSV4_E_FORMAT, "pre_tokenizer Split without a Regex or String pattern");
        /* A literal pattern: quote it. \Q...\E cannot hold "\E", so quote byte by byte instead. */
        dsv4_strbuf q;
        dsv4_sb_init(&q);
        for (const char *p = lit; *p; p++) {
            if (strchr("\\^$.|?*+()[]{}", *p)) dsv4_sb_putc(&q, '\\');
            dsv4_sb_putc(&q, *p);
        }
        int rc = q.oom ? dsv4_fail(err, DSV4_E_NOMEM, "out of memory") : dsv4_pretok_add_split(t->pretok, q.data ? q.data : "", err);
        dsv4_sb_free(&q);
        return rc;
    }
    if (!strcmp(type, "ByteLevel")) {
        /* The byte mapping itself is always applied by the BPE stage; only the optional regex matters here. */
        if (json_is_true(json_object_get(pt, "add_prefix_space")))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "pre_tokenizer ByteLevel with add_prefix_space is not supported");
        if (json_is_true(json_object_get(pt, "use_regex"))) return dsv4_pretok_add_split(t->pretok, GPT2_PATTERN, err);
        return 0;
    }
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "pre_tokenizer type '%s' is not supported", type);
}

static int check_model_and_normalizer(json_t *root, dsv4_error *err) {
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        const char *type = json_str_field(norm, "type");
        json_t *list = json_object_get(norm, "normalizers");
        if (!type || strcmp(type, "Sequence") || !json_is_array(list) || json_array_size(list) != 0)
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "normalizer '%s' is not supported (only none / an empty Sequence)",
                             type ? type : "?");
    }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return dsv4_fail(err, DSV4_E_FORMAT, "tokenizer.json has no \"model\" object");
    const char *type = json_str_field(model, "type");
    if (type && strcmp(type, "BPE"))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "model type '%s' is not supported (only BPE)", type);
    const char *csp = json_str_field(model, "continuing_subword_prefix");
    const char *ews = json_str_field(model, "end_of_word_suffix");
    if ((csp && *csp) || (ews && *ews))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "BPE with a subword prefix/suffix is not supported");
    if (!json_is_object(json_object_get(model, "vocab")))
        return dsv4_fail(err, DSV4_E_FORMAT, "tokenizer.json model has no \"vocab\" object");
    if (!json_is_array(json_object_get(model, "merges")))
        return dsv4_fail(err, DSV4_E_FORMAT, "tokenizer.json model has no \"merges\" array");
    return 0;
}

/* Largest token id accepted. Every per-id table has max id + 1 slots, so one token with a huge id made a 4 KB
 * file cost gigabytes and seconds to load (tests/fuzz/fuzz_tokenizer_load.c, regressions/tokenizer_load/);
 * 2^22 - 1 is 16 times the largest released vocabulary (~262k). */
#define MAX_TOKEN_ID ((1 << 22) - 1)

/* Fill tok_str / vocab / added tables. Every string is copied into one pool so the JSON can be freed. */
static int load_tables(dsv4_tokenizer *t, json_t *root, dsv4_error *err) {
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added)) return dsv4_fail(err, DSV4_E_FORMAT, "\"added_tokens\" is not an array");

    size_t pool = 0, n_entries = 0;
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) > MAX_TOKEN_ID)
            return dsv4_fail(err, DSV4_E_FORMAT, "vocab entry '%.40s' has an invalid id", key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
        pool += strlen(key) + 1;
        n_entries++;
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        const char *content = json_str_field(val, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > MAX_TOKEN_ID || !content ||
            !*content)
            return dsv4_fail(err, DSV4_E_FORMAT, "added_tokens[%zu] needs an id and a non-empty content", i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
        pool += strlen(content) + 1;
    }
    if (max_id < 0) return dsv4_fail(err, DSV4_E_FORMAT, "empty vocabulary");
    t->n_vocab = (int32_t)max_id + 1;   /* ids were checked to be <= MAX_TOKEN_ID above */
    size_t nv = (size_t)t->n_vocab;
    t->tok_str = calloc(nv, sizeof *t->tok_str);
    t->tok_len = calloc(nv, sizeof *t->tok_len);
    t->is_added = calloc(nv, 1);
    t->str_pool = malloc(pool + 1);
    if (!t->tok_str || !t->tok_len || !t->is_added || !t->str_pool || dsv4_strmap_init(&t->vocab, n_entries) ||
        dsv4_strmap_init(&t->added, json_array_size(added) + 1))
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory loading the vocabulary");
    char *p = t->str_pool;
    json_object_foreach(vocab, key, val) {
        size_t len = strlen(key);
        int32_t id = (int32_t)json_integer_value(val);
        memcpy(p, key, len + 1);
        t->tok_str[id] = p;
        t->tok_len[id] = (uint32_t)len;
        dsv4_strmap_put(&t->vocab, p, len, id);
        p += len + 1;
    }
    t->trie_cap = 1024;
    t->trie = malloc((size_t)t->trie_cap * sizeof *t->trie);
    if (!t->trie) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    t->trie[0] = (trie_node){-1, -1, -1, 0};
    t->trie_n = 1;
    json_array_foreach(added, i, val) {
        const char *content = json_str_field(val, "content");
        int32_t id = (int32_t)json_integer_value(json_object_get(val, "id"));
        size_t len = strlen(content);
        if (dsv4_utf8_valid_prefix(content, len) != len)
            return dsv4_fail(err, DSV4_E_FORMAT, "added token %d is not valid UTF-8", id);
        memcpy(p, content, len + 1);
        /* An added token's text wins over a vocabulary entry with the same id (HF decodes it literally). */
        t->tok_str[id] = p;
        t->tok_len[id] = (uint32_t)len;
        t->is_added[id] = 1;
        dsv4_strmap_put(&t->added, p, len, id);
        if (trie_add(t, p, len, id)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        t->first_byte[(unsigned char)p[0]] = 1;
        t->n_added++;
        p += len + 1;
    }
    return 0;
}

static int load_merges(dsv4_tokenizer *t, json_t *root, dsv4_error *err) {
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    size_t n = json_array_size(merges);
    if (n > 0x7FFFFFF) return dsv4_fail(err, DSV4_E_FORMAT, "too many merges");
    if (dsv4_pairmap_init(&t->merges, n)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    char buf[1024];
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) {
            /* "left right": byte-level symbols never contain a real space, so the first space separates them. */
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1]) return dsv4_fail(err, DSV4_E_FORMAT, "merge %zu '%.40s' is not 'a b'", i, s);
            a = s; la = (size_t)(sp - s);
            b = sp + 1; lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)); la = strlen(a);
            b = json_string_value(json_array_get(m, 1)); lb = strlen(b);
        } else {
            return dsv4_fail(err, DSV4_E_FORMAT, "merge %zu is neither \"a b\" nor [a, b]", i);
        }
        if (la + lb >= sizeof buf) return dsv4_fail(err, DSV4_E_FORMAT, "merge %zu is too long", i);
        int32_t ia = dsv4_strmap_get(&t->vocab, a, la), ib = dsv4_strmap_get(&t->vocab, b, lb);
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t im = dsv4_strmap_get(&t->vocab, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0)
            return dsv4_fail(err, DSV4_E_FORMAT, "merge %zu '%.*s %.*s' uses or makes a token missing from the vocab",
                             i, (int)(la > 40 ? 40 : la), a, (int)(lb > 40 ? 40 : lb), b);
        if (dsv4_pairmap_put(&t->merges, ia, ib, (int32_t)i, im)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    t->n_merges = (int)n;
    return 0;
}

static int build_byte_ids(dsv4_tokenizer *t, dsv4_error *err) {
    for (int b = 0; b < 256; b++) {
        char u[4];
        int l = dsv4_utf8_encode(dsv4_byte_to_cp((unsigned char)b), u);
        t->byte_id[b] = dsv4_strmap_get(&t->vocab, u, (size_t)l);
        if (t->byte_id[b] < 0)
            return dsv4_fail(err, DSV4_E_FORMAT, "vocab lacks the byte-level symbol for byte 0x%02X", b);
    }
    return 0;
}

/* Precompute every id's decoded bytes once, so decoding is a table lookup. */
static int build_decode_table(dsv4_tokenizer *t, dsv4_error *err) {
    size_t total = 0, nv = t->n_vocab > 0 ? (size_t)t->n_vocab : 0;
    for (size_t id = 0; id < nv; id++) total += t->tok_len[id];
    t->dec = calloc(nv, sizeof *t->dec);
    t->dec_len = calloc(nv, sizeof *t->dec_len);
    t->dec_pool = malloc(total + 1);
    if (!t->dec || !t->dec_len || !t->dec_pool) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    char *p = t->dec_pool;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->tok_str[id];
        if (!s) continue;
        size_t n = t->tok_len[id];
        t->dec[id] = p;
        if (t->is_added[id]) {
            memcpy(p, s, n);
            p += n;
        } else {
            /* Inverse byte map; a character outside the alphabet (never in a byte-level vocab) is kept as is. */
            const unsigned char *u = (const unsigned char *)s;
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                int l = dsv4_utf8_decode(u + i, n - i, &cp);
                if (!l) { *p++ = (char)u[i++]; continue; }
                int byte = dsv4_cp_to_byte(cp);
                if (byte >= 0) *p++ = (char)byte;
                else { memcpy(p, u + i, (size_t)l); p += l; }
                i += (size_t)l;
            }
        }
        t->dec_len[id] = (uint32_t)(p - t->dec[id]);
    }
    return 0;
}

static int32_t config_token_id(const dsv4_tokenizer *t, json_t *cfg, const char *field) {
    json_t *v = json_object_get(cfg, field);
    const char *s = json_is_string(v) ? json_string_value(v) : json_str_field(v, "content");
    return s ? dsv4_tokenizer_token_id(t, s) : -1;
}

/* tokenizer_config.json, already parsed: add_bos_token and the BOS / EOS names. `what` names it in messages. */
static int apply_config(dsv4_tokenizer *t, json_t *cfg, const char *what, dsv4_error *err) {
    t->add_bos = json_is_true(json_object_get(cfg, "add_bos_token"));
    int32_t bos = config_token_id(t, cfg, "bos_token"), eos = config_token_id(t, cfg, "eos_token");
    if (bos >= 0) t->bos_id = bos;
    if (eos >= 0) t->eos_id = eos;
    if (t->add_bos && t->bos_id < 0)
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: add_bos_token is set but the BOS token is unknown", what);
    return 0;
}

/* Build a tokenizer from a parsed tokenizer.json (root, owned by the caller); `what` names it in messages.
 * The BOS / EOS ids default to the DeepSeek names; apply_config may override them afterwards. */
static int load_parsed(json_t *root, const char *what, dsv4_tokenizer **out, dsv4_error *err) {
    *out = NULL;
    dsv4_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    int rc;
    t->bos_id = t->eos_id = -1;
    if ((rc = check_model_and_normalizer(root, err)) || (rc = load_tables(t, root, err)) ||
        (rc = load_merges(t, root, err)) || (rc = build_byte_ids(t, err)) || (rc = dsv4_pretok_new(&t->pretok, err)) ||
        (rc = add_pretokenizer(t, json_object_get(root, "pre_tokenizer"), err)) || (rc = build_decode_table(t, err))) {
        dsv4_tokenizer_free(t);
        return dsv4_wrap(err, "loading %s", what);
    }
    /* Defaults for DeepSeek-style tables when no config names them. */
    if (t->bos_id < 0) t->bos_id = dsv4_tokenizer_token_id(t, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    if (t->eos_id < 0) t->eos_id = dsv4_tokenizer_token_id(t, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    *out = t;
    return 0;
}

int dsv4_tokenizer_load(const char *json_path, const char *config_path, dsv4_tokenizer **out, dsv4_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je);
    if (!root) {
        FILE *f = fopen(json_path, "rb");
        if (!f) return dsv4_fail(err, DSV4_E_IO, "cannot open tokenizer file %s", json_path);
        fclose(f);
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: line %d: %s", json_path, je.line, je.text);
    }
    dsv4_tokenizer *t;
    int rc = load_parsed(root, json_path, &t, err);
    json_decref(root);
    if (rc) return rc;
    if (config_path) {
        json_t *cfg = json_load_file(config_path, 0, &je);
        rc = cfg ? apply_config(t, cfg, config_path, err)
                 : dsv4_fail(err, DSV4_E_FORMAT, "%s: line %d: %s", config_path, je.line, je.text);
        json_decref(cfg);
        if (rc) { dsv4_tokenizer_free(t); return rc; }
    }
    *out = t;
    return 0;
}

int dsv4_tokenizer_load_mem(const char *json, size_t len, const char *config_json, size_t config_len,
                            dsv4_tokenizer **out, dsv4_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root) return dsv4_fail(err, DSV4_E_FORMAT, "tokenizer.json: line %d: %s", je.line, je.text);
    dsv4_tokenizer *t;
    int rc = load_parsed(root, "tokenizer.json", &t, err);
    json_decref(root);
    if (rc) return rc;
    if (config_json) {
        json_t *cfg = json_loadb(config_json, config_len, 0, &je);
        rc = cfg ? apply_config(t, cfg, "tokenizer_config.json", err)
                 : dsv4_fail(err, DSV4_E_FORMAT, "tokenizer_config.json: line %d: %s", je.line, je.text);
        json_decref(cfg);
        if (rc) { dsv4_tokenizer_free(t); return rc; }
    }
    *out = t;
    return 0;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int dsv4_tokenizer_load_dir(const char *dir, dsv4_tokenizer **out, dsv4_error *err) {
    size_t n = strlen(dir) + 32;
    char *tj = malloc(n), *tc = malloc(n);
    if (!tj || !tc) { free(tj); free(tc); return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); }
    snprintf(tj, n, "%s/tokenizer.json", dir);
    snprintf(tc, n, "%s/tokenizer_config.json", dir);
    int rc = file_exists(tj) ? dsv4_tokenizer_load(tj, file_exists(tc) ? tc : NULL, out, err)
                             : dsv4_fail(err, DSV4_E_IO, "%s has no tokenizer.json", dir);
    free(tj);
    free(tc);
    return rc;
}

int dsv4_tokenizer_load_file(const char *json_path, dsv4_tokenizer **out, dsv4_error *err) {
    size_t n = strlen(json_path) + 32;
    char *tc = malloc(n);
    if (!tc) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    const char *slash = strrchr(json_path, '/');
    int dirlen = slash ? (int)(slash - json_path) : 1;
    snprintf(tc, n, "%.*s/tokenizer_config.json", dirlen, slash ? json_path : ".");
    int rc = dsv4_tokenizer_load(json_path, file_exists(tc) ? tc : NULL, out, err);
    free(tc);
    return rc;
}

void dsv4_tokenizer_free(dsv4_tokenizer *t) {
    if (!t) return;
    free(t->tok_str); free(t->tok_len); free(t->str_pool);
    free(t->dec); free(t->dec_len); free(t->dec_pool);
    free(t->is_added); free(t->trie);
    dsv4_strmap_free(&t->vocab);
    dsv4_strmap_free(&t->added);
    dsv4_pairmap_free(&t->merges);
    dsv4_pretok_free(t->pretok);
    free(t);
}

/* ---------------------------------------------------------------- encoding */

typedef struct {
    const dsv4_tokenizer *t;
    dsv4_bpe_scratch sc;
    dsv4_idvec out;
} encode_ctx;

static int on_piece(void *ud, const char *s, size_t n) {
    encode_ctx *c = ud;
    return dsv4_bpe_encode(&c->t->merges, c->t->byte_id, (const unsigned char *)s, n, &c->sc, &c->out) ? DSV4_E_NOMEM
                                                                                                       : 0;
}

static int encode_span(encode_ctx *c, const char *s, size_t n, dsv4_error *err) {
    int rc = dsv4_pretok_run(c->t->pretok, s, n, on_piece, c, err);
    if (rc == DSV4_E_NOMEM) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory while encoding");
    return rc;
}

int dsv4_tokenizer_encode(const dsv4_tokenizer *t, const char *text, size_t n, int flags, int32_t **ids,
                          size_t *n_ids, dsv4_error *err) {
    *ids = NULL;
    *n_ids = 0;
    size_t bad = dsv4_utf8_valid_prefix(text, n);
    if (bad != n) return dsv4_fail(err, DSV4_E_ARG, "input is not valid UTF-8 (byte offset %zu)", bad);
    encode_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    int rc = 0;
    if (flags & DSV4_ENCODE_ADD_BOS) {
        if (t->bos_id < 0) return dsv4_fail(err, DSV4_E_ARG, "this tokenizer has no BOS token");
        dsv4_idvec_push(&c.out, t->bos_id);
    }
    const unsigned char *u = (const unsigned char *)text;
    size_t span = 0;
    if (!(flags & DSV4_ENCODE_PLAIN) && t->n_added) {
        for (size_t pos = 0; pos < n && !rc;) {
            int32_t id;
            size_t len;
            if (t->first_byte[u[pos]] && (len = trie_longest(t, u + pos, n - pos, &id))) {
                rc = encode_span(&c, text + span, pos - span, err);
                dsv4_idvec_push(&c.out, id);
                pos += len;
                span = pos;
            } else {
                pos++;
            }
        }
    }
    if (!rc) rc = encode_span(&c, text + span, n - span, err);
    dsv4_bpe_scratch_free(&c.sc);
    if (!rc && c.out.oom) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory while encoding");
    if (rc) { dsv4_idvec_free(&c.out); return rc; }
    if (!c.out.v) {
        c.out.v = malloc(sizeof *c.out.v);
        if (!c.out.v) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    *ids = c.out.v;
    *n_ids = c.out.n;
    return 0;
}

/* ---------------------------------------------------------------- decoding */

const char *dsv4_tokenizer_token_bytes(const dsv4_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || !t->dec[id]) return NULL;
    if (len) *len = t->dec_len[id];
    return t->dec[id];
}

void dsv4_detokenizer_init(dsv4_detokenizer *d, const dsv4_tokenizer *t) {
    d->tok = t;
    dsv4_utf8_stream_init(&d->utf8);
}

int dsv4_detokenizer_push(dsv4_detokenizer *d, int32_t id, dsv4_strbuf *out, dsv4_error *err) {
    size_t len;
    const char *b = dsv4_tokenizer_token_bytes(d->tok, id, &len);
    if (!b) return dsv4_fail(err, DSV4_E_ARG, "token id %d is not in the vocabulary (size %d)", id, d->tok->n_vocab);
    dsv4_utf8_stream_push(&d->utf8, b, len, out);
    return out->oom ? dsv4_fail(err, DSV4_E_NOMEM, "out of memory") : 0;
}

void dsv4_detokenizer_finish(dsv4_detokenizer *d, dsv4_strbuf *out) { dsv4_utf8_stream_flush(&d->utf8, out); }

int dsv4_tokenizer_decode(const dsv4_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *out_len,
                          dsv4_error *err) {
    dsv4_detokenizer d;
    dsv4_detokenizer_init(&d, t);
    dsv4_strbuf b;
    dsv4_sb_init(&b);
    for (size_t i = 0; i < n; i++) {
        int rc = dsv4_detokenizer_push(&d, ids[i], &b, err);
        if (rc) { dsv4_sb_free(&b); return rc; }
    }
    dsv4_detokenizer_finish(&d, &b);
    *out = dsv4_sb_take(&b, out_len);
    return *out ? 0 : dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
}

/* ---------------------------------------------------------------- queries */

int32_t dsv4_tokenizer_token_id(const dsv4_tokenizer *t, const char *s) {
    size_t n = strlen(s);
    int32_t id = dsv4_strmap_get(&t->added, s, n);
    return id >= 0 ? id : dsv4_strmap_get(&t->vocab, s, n);
}

int32_t dsv4_tokenizer_vocab_size(const dsv4_tokenizer *t) { return t->n_vocab; }
int     dsv4_tokenizer_n_merges(const dsv4_tokenizer *t) { return t->n_merges; }
int     dsv4_tokenizer_n_added(const dsv4_tokenizer *t) { return t->n_added; }
int     dsv4_tokenizer_add_bos(const dsv4_tokenizer *t) { return t->add_bos; }
int32_t dsv4_tokenizer_bos_id(const dsv4_tokenizer *t) { return t->bos_id; }
int32_t dsv4_tokenizer_eos_id(const dsv4_tokenizer *t) { return t->eos_id; }

int dsv4_tokenizer_is_added(const dsv4_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->is_added[id];
}
