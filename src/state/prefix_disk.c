/* The on-disk tier of the prefix cache (see dsv4_prefix_cache_set_dir in dsv4.h).
 *
 * A file per stored state, named p-<model fingerprint>-<token count>-<XXH64 of the tokens>.dsv4seq, so a
 * lookup finds its candidates from the names alone and loads only the longest; the state file itself carries
 * the fingerprint, the tokens and a checksum, so a misnamed or damaged file is caught on load. Recency is the
 * file's modification time (touched on every hit): eviction removes the oldest files until the folder fits. */
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

static uint64_t tokens_hash(const int32_t *t, int64_t n) {
    return n > 0 ? XXH64(t, sizeof(int32_t) * (size_t)n, 0) : 0;
}

static void file_name(char *out, size_t size, const char *dir, uint64_t fp, int64_t n, uint64_t h) {
    snprintf(out, size, "%s/p-%016" PRIx64 "-%" PRId64 "-%016" PRIx64 ".dsv4seq", dir, fp, n, h);
}

static int parse_name(const char *name, uint64_t *fp, int64_t *n, uint64_t *h) {
    char tail[16];
    return sscanf(name, "p-%16" SCNx64 "-%" SCNd64 "-%16" SCNx64 "%15s", fp, n, h, tail) == 4 && !strcmp(tail, ".dsv4seq");
}

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

/* The total size of the cache files, and the oldest one (for eviction). */
static size_t scan_sizes(const prefix_disk *d, char *oldest, size_t oldest_size) {
    DIR *dh = opendir(d->dir);
    if (!dh) return 0;
    size_t total = 0;
    time_t t_old = 0;
    oldest[0] = 0;
    struct dirent *e;
    while ((e = readdir(dh))) {
        uint64_t fp, h;
        int64_t n;
        if (!parse_name(e->d_name, &fp, &n, &h)) continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", d->dir, e->d_name);
        struct stat st;
        if (stat(path, &st)) continue;
        total += (size_t)st.st_size;
        if (!oldest[0] || st.st_mtime < t_old) {
            t_old = st.st_mtime;
            snprintf(oldest, oldest_size, "%s", path);
        }
    }
    closedir(dh);
    return total;
}

static void enforce_budget(prefix_disk *d) {
    char oldest[4200];
    for (;;) {
        size_t total = scan_sizes(d, oldest, sizeof oldest);
        d->bytes = total;
        if (total <= d->budget || !oldest[0]) return;
        if (unlink(oldest)) return;
        d->evictions++;
    }
}

int prefix_disk_put(prefix_disk *d, const dsv4_seq *s, dsv4_error *err) {
    if (!d->dir || s->pos == 0) return 0;
    if (dsv4_seq_state_bytes(s) > d->budget) return 0;   /* could never fit */
    char path[4200];
    file_name(path, sizeof path, d->dir, s->model->fingerprint, s->pos, tokens_hash(s->tokens, s->pos));
    struct stat st;
    if (!stat(path, &st)) { utime(path, NULL); return 0; }   /* stored already: now the most recent */
    int rc = dsv4_seq_save(s, path, err);
    if (rc) return rc;
    d->writes++;
    enforce_budget(d);
    return 0;
}

int prefix_disk_lookup(prefix_disk *d, dsv4_model *m, const int32_t *tokens, int64_t n, int64_t longer_than,
                       dsv4_seq **out, dsv4_error *err) {
    *out = NULL;
    if (!d->dir) return 0;
    for (;;) {
        /* the longest file of this model whose length fits and whose name hash matches the request's prefix */
        DIR *dh = opendir(d->dir);
        if (!dh) return 0;
        int64_t best_n = longer_than;
        char best[4200] = "";
        struct dirent *e;
        while ((e = readdir(dh))) {
            uint64_t fp, h;
            int64_t k;
            if (!parse_name(e->d_name, &fp, &k, &h) || fp != m->fingerprint || k <= best_n || k > n) continue;
            if (h != tokens_hash(tokens, k)) continue;
            best_n = k;
            snprintf(best, sizeof best, "%s/%s", d->dir, e->d_name);
        }
        closedir(dh);
        if (!best[0]) return 0;
        dsv4_seq *s = NULL;
        dsv4_error lerr;
        int bad = dsv4_seq_load(m, best, &s, &lerr) != 0;
        if (!bad) bad = dsv4_seq_position(s) != best_n ||
                        memcmp(dsv4_seq_tokens(s), tokens, sizeof(int32_t) * (size_t)best_n) != 0;
        if (bad) {
            /* damaged, foreign or misnamed: remove it and look again (the caller recomputes what is missing) */
            dsv4_seq_free(s);
            unlink(best);
            d->rejected++;
            continue;
        }
        utime(best, NULL);
        d->hits++;
        *out = s;
        return 0;
    }
    (void)err;
}
