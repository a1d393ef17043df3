#include "model/safetensors.h"
#include "util/error.h"
#include "util/bigmem.h"
#include "util/fileio.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; int size; } dtype_info[ST_N_DTYPES] = {
    [ST_BF16] = {"BF16", 2},    [ST_F16] = {"F16", 2},   [ST_F32] = {"F32", 4},   [ST_F64] = {"F64", 8},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E8M0] = {"F8_E8M0", 1}, [ST_I8] = {"I8", 1}, [ST_U8] = {"U8", 1},
    [ST_I16] = {"I16", 2},      [ST_I32] = {"I32", 4},   [ST_I64] = {"I64", 8},   [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(st_dtype d) { return (unsigned)d < ST_N_DTYPES ? dtype_info[d].name : "?"; }
int st_dtype_size(st_dtype d) { return (unsigned)d < ST_N_DTYPES ? dtype_info[d].size : 0; }
int st_dtype_parse(const char *s, st_dtype *out) {
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (!strcmp(s, dtype_info[i].name)) { *out = (st_dtype)i; return 0; }
    return -1;
}

int64_t st_numel(const st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

const st_tensor *st_find(const st_archive *a, const char *name) {
    st_tensor key = { .name = (char *)name };
    return bsearch(&key, a->tensors, (size_t)a->n_tensors, sizeof key, cmp_tensor);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22   /* Linux 5.14's value, for older headers; an older kernel answers EINVAL */
#endif

void st_populate(const void *p, size_t n) {
    if (!p || !n) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(page - 1);
    (void)madvise((void *)a, (uintptr_t)p + n - a, MADV_POPULATE_READ);   /* a hint: failure changes nothing */
}

static const char *const memory_names[] = { [ST_MEM_MAP] = "map", [ST_MEM_POPULATE] = "populate", [ST_MEM_COPY] = "copy" };

const char *st_memory_name(st_memory m) { return (unsigned)m <= ST_MEM_COPY ? memory_names[m] : "?"; }

const char *st_memory_words(st_memory m) {
    return m == ST_MEM_COPY ? "copied to huge pages" : m == ST_MEM_POPULATE ? "the file mapping, populated" : "the file mapping";
}

int st_memory_choose(uint64_t bytes, st_memory *out, dsv4_error *err) {
    const char *e = getenv("DSV4_WEIGHT_MEMORY");
    if (e) {
        for (int m = ST_MEM_MAP; m <= ST_MEM_COPY; m++)
            if (!strcmp(e, memory_names[m])) {
                *out = (st_memory)m;
                return 0;
            }
        return dsv4_fail(err, DSV4_E_ARG, "DSV4_WEIGHT_MEMORY: expected map, populate or copy, got '%s'", e);
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    *out = pages > 0 && page > 0 && (double)bytes <= 0.75 * (double)pages * (double)page ? ST_MEM_COPY : ST_MEM_MAP;
    return 0;
}

int st_copy_shards(st_archive *a, int threads, dsv4_error *err) {
    for (int i = 0; i < a->n_shards; i++) {
        st_shard *sh = &a->shards[i];
        if (sh->copied || !sh->len) continue;
        char *copy = bigmem_alloc(sh->len);
        if (!copy) return dsv4_fail(err, DSV4_E_NOMEM, "%s: out of memory for a %.2f GB copy of the weights", sh->path, sh->len / 1e9);
        const int fd = open(sh->path, O_RDONLY);
        if (fd < 0 || bigmem_pread(copy, fd, 0, sh->len, threads)) {
            const int e = errno;
            if (fd >= 0) close(fd);
            bigmem_free(copy, sh->len);
            return dsv4_fail(err, DSV4_E_IO, "%s: reading the weights into memory: %s", sh->path,
                             e == ENODATA ? "the file is shorter than when it was opened" : strerror(e));
        }
        close(fd);
        const char *old = sh->map;
        for (int t = 0; t < a->n_tensors; t++)
            if (a->tensors[t].shard == i) a->tensors[t].data = copy + ((const char *)a->tensors[t].data - old);
        munmap(sh->map, sh->len);
        sh->map = copy;
        sh->copied = 1;
    }
    return 0;
}

static int map_shard(const char *path, st_shard *sh, dsv4_error *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return dsv4_fail(err, DSV4_E_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return dsv4_fail(err, DSV4_E_IO, "%s: %s", path, strerror(errno)); }
    sh->len = (size_t)st.st_size;
    sh->path = strdup(path);
    sh->map = NULL;
    if (sh->len > 0) {
        sh->map = mmap(NULL, sh->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (sh->map == MAP_FAILED) {
            sh->map = NULL;
            close(fd);
            return dsv4_fail(err, DSV4_E_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
    }
    close(fd);
    return 0;
}

/* Parse one shard's header and append its tensors. */
static int parse_shard(st_archive *a, int shard_idx, dsv4_error *err) {
    st_shard *sh = &a->shards[shard_idx];
    if (sh->len < 8) return dsv4_fail(err, DSV4_E_FORMAT, "%s: file too short for a safetensors header", sh->path);
    uint64_t hlen = 0;
    memcpy(&hlen, sh->map, 8); /* little-endian host assumed (x86-64 / aarch64) */
    if (hlen > sh->len - 8 || hlen > (1u << 30))
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: header length %llu exceeds the file (%zu bytes): truncated?",
                         sh->path, (unsigned long long)hlen, sh->len);
    json_error_t jerr;
    json_t *hdr = json_loadb((const char *)sh->map + 8, (size_t)hlen, 0, &jerr);
    if (!hdr) return dsv4_fail(err, DSV4_E_FORMAT, "%s: malformed header JSON: %s", sh->path, jerr.text);
    int rc = 0;
    if (!json_is_object(hdr)) { rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: header is not an object", sh->path); goto out; }
    const size_t data_start = 8 + (size_t)hlen, data_len = sh->len - data_start;
    size_t n_new = json_object_size(hdr);
    st_tensor *nt = realloc(a->tensors, sizeof(st_tensor) * ((size_t)a->n_tensors + n_new));
    if (!nt) { rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); goto out; }
    a->tensors = nt;
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: entry needs dtype, shape and data_offsets", sh->path, key);
            goto out;
        }
        st_tensor t = {0};
        if (st_dtype_parse(json_string_value(jd), &t.dtype)) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: unknown dtype %s", sh->path, key, json_string_value(jd));
            goto out;
        }
        if (json_array_size(js) > ST_MAX_DIMS) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: more than %d dimensions", sh->path, key, ST_MAX_DIMS);
            goto out;
        }
        t.ndim = (int)json_array_size(js);
        int64_t numel = 1;
        for (int i = 0; i < t.ndim; i++) {
            json_t *d = json_array_get(js, (size_t)i);
            if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > (1LL << 40)) {
                rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: bad shape", sh->path, key);
                goto out;
            }
            t.shape[i] = json_integer_value(d);
            numel *= t.shape[i];
            if (numel > (1LL << 42)) { rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: shape too large", sh->path, key); goto out; }
        }
        json_t *b0 = json_array_get(jo, 0), *b1 = json_array_get(jo, 1);
        if (!json_is_integer(b0) || !json_is_integer(b1)) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: bad data_offsets", sh->path, key);
            goto out;
        }
        int64_t begin = json_integer_value(b0), end = json_integer_value(b1);
        if (begin < 0 || end < begin) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: bad data_offsets [%lld, %lld]", sh->path, key,
                           (long long)begin, (long long)end);
            goto out;
        }
        if ((uint64_t)end > data_len) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: data [%lld, %lld) runs past the end of the file "
                           "(%zu data bytes): truncated shard?", sh->path, key, (long long)begin, (long long)end, data_len);
            goto out;
        }
        if ((int64_t)(end - begin) != numel * st_dtype_size(t.dtype)) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: %lld bytes stored but shape x dtype needs %lld",
                           sh->path, key, (long long)(end - begin), (long long)(numel * st_dtype_size(t.dtype)));
            goto out;
        }
        t.data = (const char *)sh->map + data_start + begin;
        t.nbytes = (size_t)(end - begin);
        t.shard = shard_idx;
        t.name = strdup(key);
        a->tensors[a->n_tensors++] = t;
    }
out:
    json_decref(hdr);
    return rc;
}

static int finish(st_archive *a, dsv4_error *err) {
    /* an index naming no tensor leaves tensors NULL, and qsort's pointer must not be NULL even for 0 elements
     * (found by fuzz_st_index, tests/fuzz/regressions/st_index/) */
    if (a->n_tensors > 1) qsort(a->tensors, (size_t)a->n_tensors, sizeof(st_tensor), cmp_tensor);
    for (int i = 1; i < a->n_tensors; i++)
        if (!strcmp(a->tensors[i].name, a->tensors[i - 1].name))
            return dsv4_fail(err, DSV4_E_FORMAT, "tensor %s appears twice (in %s and %s)", a->tensors[i].name,
                             a->shards[a->tensors[i - 1].shard].path, a->shards[a->tensors[i].shard].path);
    return 0;
}

static int add_shard(st_archive *a, const char *path, dsv4_error *err) {
    st_shard *ns = realloc(a->shards, sizeof(st_shard) * (size_t)(a->n_shards + 1));
    if (!ns) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    a->shards = ns;
    memset(&a->shards[a->n_shards], 0, sizeof(st_shard));
    int rc = map_shard(path, &a->shards[a->n_shards], err);
    a->n_shards++;
    if (rc) return rc;
    return parse_shard(a, a->n_shards - 1, err);
}

int st_open_file(const char *path, st_archive *a, dsv4_error *err) {
    memset(a, 0, sizeof *a);
    int rc = add_shard(a, path, err);
    if (!rc) rc = finish(a, err);
    if (rc) st_close(a);
    return rc;
}

int st_open_dir(const char *dir, st_archive *a, dsv4_error *err) {
    memset(a, 0, sizeof *a);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    char *text = NULL;
    if (access(path, F_OK) != 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) != 0)
            return dsv4_fail(err, DSV4_E_IO, "%s: no model.safetensors.index.json or model.safetensors", dir);
        return st_open_file(path, a, err);
    }
    int rc = dsv4_read_file(path, &text, NULL, err);
    if (rc) return rc;
    json_error_t jerr;
    json_t *idx = json_loads(text, 0, &jerr);
    free(text);
    if (!idx) return dsv4_fail(err, DSV4_E_FORMAT, "%s: malformed JSON at line %d: %s", path, jerr.line, jerr.text);
    json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(idx);
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: missing object \"weight_map\"", path);
    }
    /* Open each distinct shard once, in first-seen order. */
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val)) { rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: weight_map[%s] is not a string", path, key); break; }
        const char *file = json_string_value(val);
        if (strchr(file, '/') || !strcmp(file, "..")) { rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: shard name %s is not a plain file name", path, file); break; }
        char sp[4096];
        snprintf(sp, sizeof sp, "%s/%s", dir, file);
        int seen = 0;
        for (int i = 0; i < a->n_shards; i++) seen |= !strcmp(a->shards[i].path, sp);
        if (!seen && (rc = add_shard(a, sp, err))) break;
    }
    if (!rc) rc = finish(a, err);
    /* Every tensor the index names must be in the shard it names. */
    if (!rc) json_object_foreach(wm, key, val) {
        const st_tensor *t = st_find(a, key);
        char sp[4096];
        snprintf(sp, sizeof sp, "%s/%s", dir, json_string_value(val));
        if (!t) { rc = dsv4_fail(err, DSV4_E_MODEL, "tensor %s is listed in the index but missing from %s", key, sp); break; }
        if (strcmp(a->shards[t->shard].path, sp)) {
            rc = dsv4_fail(err, DSV4_E_MODEL, "tensor %s: index says %s, found in %s", key, sp, a->shards[t->shard].path);
            break;
        }
    }
    json_decref(idx);
    if (rc) st_close(a);
    return rc;
}

void st_close(st_archive *a) {
    for (int i = 0; i < a->n_tensors; i++) free(a->tensors[i].name);
    free(a->tensors);
    for (int i = 0; i < a->n_shards; i++) {
        if (a->shards[i].copied) bigmem_free(a->shards[i].map, a->shards[i].len);
        else if (a->shards[i].map) munmap(a->shards[i].map, a->shards[i].len);
        free(a->shards[i].path);
    }
    free(a->shards);
    memset(a, 0, sizeof *a);
}
