/* The on-disk tier of the prefix cache (see dsv4_prefix_cache_set_dir in dsv4.h).
 *
 * A file per stored state, named p-<model fingerprint>-<token count>-<XXH64 of the tokens>.dsv4seq, so a
 * lookup finds its candidates from the names alone and loads only the longest; the state file itself carries
 * the fingerprint, the tokens and a checksum, so a misnamed or damaged file is caught on load. Beside it, one file
 * per speculative drafter that stored its state with the entry (prefix_companion.h):
 * p-<fingerprint>-<count>-<hash>.<kind>.dsv4comp, bound to the state by the same fingerprint, position and token
 * hash inside, and checksummed. Recency is the state file's modification time (touched on every hit, with the
 * companion's): eviction removes companions whose state is gone first, then the oldest state with its
 * companions, until the folder fits. */
#define _GNU_SOURCE
#include "state/prefix_disk.h"
#include "model/model.h"
#include "state/sequence.h"
#include "util/error.h"
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>
#include <xxhash.h>

#define PATH_BYTES 4200

static uint64_t tokens_hash(const int32_t *t, int64_t n) {
    return n > 0 ? XXH64(t, sizeof(int32_t) * (size_t)n, 0) : 0;
}

void prefix_disk_state_path(char *out, size_t size, const char *dir, uint64_t fp, const int32_t *tokens, int64_t n) {
    snprintf(out, size, "%s/p-%016" PRIx64 "-%" PRId64 "-%016" PRIx64 ".dsv4seq", dir, fp, n, tokens_hash(tokens, n));
}

void prefix_disk_companion_path(char *out, size_t size, const char *dir, uint64_t fp, const int32_t *tokens, int64_t n,
                                const char *kind) {
    snprintf(out, size, "%s/p-%016" PRIx64 "-%" PRId64 "-%016" PRIx64 ".%s.dsv4comp", dir, fp, n, tokens_hash(tokens, n), kind);
}

/* A cache file's name: 1 a state, 2 a companion (its kind in kind[16]), 0 anything else. */
typedef struct {
    uint64_t fp, h;
    int64_t n;
    char kind[PREFIX_COMPANION_KIND];
} file_key;

static int parse_name(const char *name, file_key *k) {
    int used = 0;
    memset(k, 0, sizeof *k);
    if (sscanf(name, "p-%16" SCNx64 "-%" SCNd64 "-%16" SCNx64 "%n", &k->fp, &k->n, &k->h, &used) != 3 || used == 0) return 0;
    const char *tail = name + used;
    if (!strcmp(tail, ".dsv4seq")) return 1;
    if (tail[0] != '.') return 0;
    const char *dot = strchr(tail + 1, '.');
    const size_t len = dot ? (size_t)(dot - tail - 1) : 0;
    if (!dot || len == 0 || len >= sizeof k->kind || strcmp(dot, ".dsv4comp")) return 0;
    for (size_t i = 0; i < len; i++) {
        const char c = tail[1 + i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
    }
    memcpy(k->kind, tail + 1, len);
    return 2;
}

static int same_entry(const file_key *a, const file_key *b) { return a->fp == b->fp && a->n == b->n && a->h == b->h; }

int prefix_disk_init(prefix_disk *d, const char *dir, size_t budget, dsv4_error *err) {
    memset(d, 0, sizeof *d);
    if (!dir || !*dir) return dsv4_fail(err, DSV4_E_ARG, "prefix cache: empty folder name");
    if (mkdir(dir, 0755) && errno != EEXIST) return dsv4_fail(err, DSV4_E_IO, "%s: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return dsv4_fail(err, DSV4_E_IO, "%s: not a folder", dir);
    d->dir = strdup(dir);
    if (!d->dir) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    d->budget = budget;
    return 0;
}

void prefix_disk_free(prefix_disk *d) {
    free(d->dir);
    d->dir = NULL;
}

/* ---- eviction ------------------------------------------------------------------------------------------- */

typedef struct {
    char name[256];
    file_key key;
    int type;        /* 1 state, 2 companion, 0 removed */
    size_t size;
    time_t mtime;
} cache_file;

/* Every cache file of the folder (*n of them; NULL when there are none or no memory). */
static cache_file *scan(const prefix_disk *d, size_t *n) {
    *n = 0;
    DIR *dh = opendir(d->dir);
    if (!dh) return NULL;
    cache_file *f = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(dh))) {
        file_key k;
        const int type = parse_name(e->d_name, &k);
        if (!type || strlen(e->d_name) >= sizeof f->name) continue;
        char path[PATH_BYTES];
        snprintf(path, sizeof path, "%s/%s", d->dir, e->d_name);
        struct stat st;
        if (stat(path, &st)) continue;
        if (*n == cap) {
            cache_file *g = realloc(f, sizeof *f * (cap ? 2 * cap : 64));
            if (!g) break;
            f = g;
            cap = cap ? 2 * cap : 64;
        }
        cache_file *c = &f[(*n)++];
        snprintf(c->name, sizeof c->name, "%s", e->d_name);
        c->key = k;
        c->type = type;
        c->size = (size_t)st.st_size;
        c->mtime = st.st_mtime;
    }
    closedir(dh);
    return f;
}

static int remove_file(const prefix_disk *d, cache_file *c) {
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/%s", d->dir, c->name);
    c->type = 0;
    return unlink(path);
}

/* Order: by entry, each entry's state before its companions. */
static int key_cmp(const void *pa, const void *pb) {
    const cache_file *a = pa, *b = pb;
    if (a->key.fp != b->key.fp) return a->key.fp < b->key.fp ? -1 : 1;
    if (a->key.n != b->key.n) return a->key.n < b->key.n ? -1 : 1;
    if (a->key.h != b->key.h) return a->key.h < b->key.h ? -1 : 1;
    return a->type - b->type;
}

static void enforce_budget(prefix_disk *d) {
    size_t n;
    cache_file *f = scan(d, &n);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += f[i].size;
    if (total <= d->budget) { d->bytes = total; free(f); return; }
    if (n) qsort(f, n, sizeof *f, key_cmp);
    /* a companion whose state is gone is of no use: those go first */
    for (size_t i = 0; i < n && total > d->budget; i++) {
        if (f[i].type != 2) continue;
        size_t j = i;
        while (j > 0 && f[j - 1].type == 2 && same_entry(&f[j - 1].key, &f[i].key)) j--;
        const int has_state = j > 0 && f[j - 1].type == 1 && same_entry(&f[j - 1].key, &f[i].key);
        if (has_state) continue;
        if (remove_file(d, &f[i]) && errno != ENOENT) continue;
        total -= f[i].size;
        d->evictions++;
    }
    /* then the least recently used state, with its companions (right after it in this order) */
    while (total > d->budget) {
        size_t victim = n;
        for (size_t i = 0; i < n; i++)
            if (f[i].type == 1 && (victim == n || f[i].mtime < f[victim].mtime)) victim = i;
        if (victim == n) break;
        if (remove_file(d, &f[victim]) && errno != ENOENT) break;
        total -= f[victim].size;
        d->evictions++;
        for (size_t j = victim + 1; j < n && f[j].type == 2 && same_entry(&f[j].key, &f[victim].key); j++)
            if (!remove_file(d, &f[j]) || errno == ENOENT) total -= f[j].size;
    }
    d->bytes = total;
    free(f);
}

/* ---- put ------------------------------------------------------------------------------------------------- */

int prefix_disk_put(prefix_disk *d, const dsv4_seq *s, const prefix_companion *comp, dsv4_error *err) {
    if (!d->dir || s->pos == 0) return 0;
    const size_t bytes = dsv4_seq_state_bytes(s);
    if (bytes > d->budget) return 0;   /* could never fit */
    const uint64_t fp = s->model->fingerprint;
    char path[PATH_BYTES];
    prefix_disk_state_path(path, sizeof path, d->dir, fp, s->tokens, s->pos);
    struct stat st;
    int wrote = 0, rc = 0;
    if (!stat(path, &st)) utime(path, NULL);   /* stored already: now the most recent */
    else if ((rc = dsv4_seq_save(s, path, err))) return rc;
    else { d->writes++; wrote = 1; }
    /* the companion's own budget check is its in-memory size, a bound on its file for the built-in drafters */
    if (comp && comp->codec && bytes + comp->bytes <= d->budget) {
        prefix_disk_companion_path(path, sizeof path, d->dir, fp, s->tokens, s->pos, comp->codec->kind);
        if (!stat(path, &st)) utime(path, NULL);
        else if (!(rc = prefix_companion_file_save(path, comp, s->model, s->tokens, s->pos, err))) { d->writes++; wrote = 1; }
    }
    if (wrote) enforce_budget(d);
    return rc;
}

/* ---- lookup ---------------------------------------------------------------------------------------------- */

int prefix_disk_lookup(prefix_disk *d, dsv4_model *m, const int32_t *tokens, int64_t n, int64_t longer_than,
                       const prefix_codec *codec, dsv4_seq **out, prefix_companion **comp, dsv4_error *err) {
    *out = NULL;
    if (comp) *comp = NULL;
    if (!d->dir) return 0;
    for (;;) {
        /* the longest state of this model whose length fits, whose name hash matches the request's prefix and,
         * with a codec, that has a companion of its kind */
        DIR *dh = opendir(d->dir);
        if (!dh) return 0;
        int64_t best_n = longer_than;
        char best[PATH_BYTES] = "", best_comp[PATH_BYTES] = "";
        struct dirent *e;
        while ((e = readdir(dh))) {
            file_key k;
            if (parse_name(e->d_name, &k) != 1 || k.fp != m->fingerprint || k.n <= best_n || k.n > n) continue;
            if (k.h != tokens_hash(tokens, k.n)) continue;
            char cpath[PATH_BYTES] = "";
            struct stat st;
            if (codec) {
                prefix_disk_companion_path(cpath, sizeof cpath, d->dir, k.fp, tokens, k.n, codec->kind);
                if (stat(cpath, &st)) continue;
            }
            best_n = k.n;
            snprintf(best, sizeof best, "%s/%s", d->dir, e->d_name);
            snprintf(best_comp, sizeof best_comp, "%s", cpath);
        }
        closedir(dh);
        if (!best[0]) return 0;
        dsv4_seq *s = NULL;
        dsv4_error lerr;
        int bad = dsv4_seq_load(m, best, &s, &lerr) != 0;
        if (!bad) bad = dsv4_seq_position(s) != best_n ||
                        memcmp(dsv4_seq_tokens(s), tokens, sizeof(int32_t) * (size_t)best_n) != 0;
        if (bad) {
            /* damaged, foreign or misnamed: remove it and look again (the caller recomputes what is missing); its
             * other companions go at the next eviction */
            dsv4_seq_free(s);
            unlink(best);
            if (codec) unlink(best_comp);
            d->rejected++;
            continue;
        }
        prefix_companion *pc = NULL;
        if (codec && prefix_companion_file_load(best_comp, codec, m, tokens, best_n, &pc, &lerr)) {
            /* the state is good for streams without a drafter; only this companion goes */
            dsv4_seq_free(s);
            unlink(best_comp);
            d->rejected++;
            continue;
        }
        utime(best, NULL);
        if (codec) utime(best_comp, NULL);
        d->hits++;
        *out = s;
        if (comp) *comp = pc;
        return 0;
    }
    (void)err;
}
