#include "model/safetensors_write.h"
#include "util/error.h"
#include "util/fileio.h"
#include <errno.h>
#include <sys/types.h>
#include <unistd.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

size_t st_write_nbytes(const st_write_tensor *t) {
    size_t n = (size_t)st_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

void st_shard_name(char *buf, size_t len, int k, int n) {
    snprintf(buf, len, "model-%05d-of-%05d.safetensors", k + 1, n);
}

/* The header JSON text of one file, padded with spaces to a multiple of 8 bytes (as the official files are, so
 * that the data section starts 8-byte aligned). Caller frees. */
static char *build_header(const st_write_tensor *t, int count, size_t *len_out, dsv4_error *err) {
    json_t *root = json_object(), *meta = json_object();
    int bad = !root || !meta;
    if (!bad) {
        json_object_set_new(meta, "format", json_string("pt"));
        json_object_set(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int i = 0; i < count && !bad; i++) {
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        bad = !e || !shape || !offs;
        for (int d = 0; d < t[i].ndim && !bad; d++) bad = json_array_append_new(shape, json_integer(t[i].shape[d]));
        uint64_t end = off + st_write_nbytes(&t[i]);
        if (!bad) bad = json_array_append_new(offs, json_integer((json_int_t)off)) ||
                        json_array_append_new(offs, json_integer((json_int_t)end));
        if (!bad) bad = json_object_set_new(e, "dtype", json_string(st_dtype_name(t[i].dtype))) ||
                        json_object_set(e, "shape", shape) || json_object_set(e, "data_offsets", offs) ||
                        json_object_set(root, t[i].name, e);
        json_decref(shape);
        json_decref(offs);
        json_decref(e);
        off = end;
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(meta);
    json_decref(root);
    if (!text) { dsv4_fail(err, DSV4_E_NOMEM, "out of memory building a safetensors header"); return NULL; }
    size_t n = strlen(text), padded = (n + 7) & ~(size_t)7;
    char *out = realloc(text, padded + 1);
    if (!out) { free(text); dsv4_fail(err, DSV4_E_NOMEM, "out of memory building a safetensors header"); return NULL; }
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    *len_out = padded;
    return out;
}

/* Write header + every tensor's bytes to an open stream. */
static int write_body(FILE *f, const char *path, const st_write_tensor *t, int first, int count, st_fill_fn fill,
                      void *user, dsv4_error *err) {
    size_t hlen = 0;
    char *hdr = build_header(t + first, count, &hlen, err);
    if (!hdr) return err ? err->code : DSV4_E_NOMEM;
    uint8_t len_le[8];
    for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(len_le, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    free(hdr);
    if (!ok) return dsv4_fail(err, DSV4_E_IO, "%s: write failed: %s", path, strerror(errno));

    size_t cap = 0;
    for (int i = first; i < first + count; i++) {
        size_t nb = st_write_nbytes(&t[i]);
        if (!t[i].hole && nb > cap) cap = nb;
    }
    void *buf = malloc(cap ? cap : 1);
    if (!buf) return dsv4_fail(err, DSV4_E_NOMEM, "%s: out of memory (%zu bytes for one tensor)", path, cap);
    int rc = 0;
    for (int i = first; i < first + count && !rc; i++) {
        size_t nb = st_write_nbytes(&t[i]);
        if (t[i].hole) {
            /* skipped: the file system keeps a hole that reads as zeros (the size is set at the end) */
            if (fseeko(f, (off_t)nb, SEEK_CUR) != 0)
                rc = dsv4_fail(err, DSV4_E_IO, "%s: seek failed at tensor %s: %s", path, t[i].name, strerror(errno));
            continue;
        }
        memset(buf, 0, nb);
        rc = fill(user, i, buf, nb, err);
        if (!rc && fwrite(buf, 1, nb, f) != nb)
            rc = dsv4_fail(err, DSV4_E_IO, "%s: write failed at tensor %s: %s", path, t[i].name, strerror(errno));
    }
    free(buf);
    /* a file that ends in a hole: its length is where the last tensor ends */
    off_t end = rc ? 0 : ftello(f);
    if (!rc && (fflush(f) != 0 || end < 0 || ftruncate(fileno(f), end) != 0))
        rc = dsv4_fail(err, DSV4_E_IO, "%s: %s", path, strerror(errno));
    return rc;
}

int st_write_file(const char *path, const st_write_tensor *tensors, int first, int count, st_fill_fn fill,
                  void *user, dsv4_error *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return dsv4_fail(err, DSV4_E_IO, "%s: %s", tmp, strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    int rc = write_body(f, path, tensors, first, count, fill, user, err);
    int ok = fflush(f) == 0;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    if (!rc && !ok) rc = dsv4_fail(err, DSV4_E_IO, "%s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0) rc = dsv4_fail(err, DSV4_E_IO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}

/* Split n tensors into n_shards contiguous runs of about total/n_shards bytes each, every run non-empty.
 * end[k] = one past the last tensor of shard k. */
static void split_shards(const st_write_tensor *t, int n, int n_shards, int *end) {
    uint64_t total = 0, cum = 0;
    for (int i = 0; i < n; i++) total += st_write_nbytes(&t[i]);
    int i = 0;
    for (int k = 0; k < n_shards; k++) {
        uint64_t target = total / (uint64_t)n_shards * (uint64_t)(k + 1);
        int must_leave = n_shards - 1 - k;      /* one tensor for each later shard */
        int start = i;
        while (i < n - must_leave && (i == start || cum < target || k == n_shards - 1)) cum += st_write_nbytes(&t[i++]);
        end[k] = i;
    }
}

static int write_index(const char *dir, const st_write_tensor *t, int n, const int *end, int n_shards,
                       dsv4_error *err) {
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    uint64_t total = 0;
    int bad = !root || !meta || !wm;
    for (int k = 0, i = 0; k < n_shards && !bad; k++) {
        char name[64];
        st_shard_name(name, sizeof name, k, n_shards);
        for (; i < end[k] && !bad; i++) {
            total += st_write_nbytes(&t[i]);
            bad = json_object_set_new(wm, t[i].name, json_string(name));
        }
    }
    if (!bad) bad = json_object_set_new(meta, "total_size", json_integer((json_int_t)total)) ||
                    json_object_set(root, "metadata", meta) || json_object_set(root, "weight_map", wm);
    char *text = bad ? NULL : json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(meta);
    json_decref(wm);
    json_decref(root);
    if (!text) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory building the safetensors index");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc = dsv4_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int st_write_sharded(const char *dir, const st_write_tensor *tensors, int n, int n_shards, st_fill_fn fill,
                     void *user, dsv4_error *err) {
    if (n < 1) return dsv4_fail(err, DSV4_E_ARG, "no tensors to write");
    if (n_shards < 1 || n_shards > n || n_shards > 99999)
        return dsv4_fail(err, DSV4_E_ARG, "cannot split %d tensors into %d shards", n, n_shards);
    int *end = malloc(sizeof *end * (size_t)n_shards);
    if (!end) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    split_shards(tensors, n, n_shards, end);
    int rc = 0;
    for (int k = 0, first = 0; k < n_shards && !rc; k++) {
        char name[64], path[4096];
        st_shard_name(name, sizeof name, k, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = st_write_file(path, tensors, first, end[k] - first, fill, user, err);
        first = end[k];
    }
    if (!rc) rc = write_index(dir, tensors, n, end, n_shards, err);
    free(end);
    return rc;
}
