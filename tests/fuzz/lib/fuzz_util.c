/* Helpers shared by the fuzz targets: invariant failures, a private temp folder, files, a deterministic rng. */
#define _GNU_SOURCE
#include "../fuzz.h"
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void fuzz_die(const char *file, int line, const char *cond, const char *fmt, ...) {
    fprintf(stderr, "\nFUZZ CHECK FAILED at %s:%d: %s\n  ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void fuzz_check_error(int rc, const dsv4_error *err) {
    FUZZ_CHECK(rc < 0 && rc == err->code, "status %d, err.code %d", rc, err->code);
    FUZZ_CHECK(err->msg[0] && strlen(err->msg) < sizeof err->msg, "empty or unterminated message");
    FUZZ_CHECK(!strpbrk(err->msg, "\n\r"), "message is not one line: %s", err->msg);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    remove(path);
    return 0;
}

void fuzz_rmtree(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* The folder is created once per process and removed by an atexit handler; its path is the only global. */
static char tmp_path[4096];

static void tmp_cleanup(void) {
    if (tmp_path[0]) fuzz_rmtree(tmp_path);
}

const char *fuzz_tmpdir(void) {
    if (!tmp_path[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmp_path, sizeof tmp_path, "%s/dsv4-fuzz-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tmp_path)) {
            fprintf(stderr, "fuzz: mkdtemp %s: %s\n", tmp_path, strerror(errno));
            abort();
        }
        atexit(tmp_cleanup);
    }
    return tmp_path;
}

void fuzz_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
}

char *fuzz_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "fuzz: cannot read %s: %s\n", path, strerror(errno)); abort(); }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) buf = realloc(buf, (cap *= 2) + 1);
    }
    fclose(f);
    if (!buf) abort();
    buf[len] = 0;
    if (n) *n = len;
    return buf;
}

char *fuzz_strndup(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, data, n);
    s[n] = 0;
    return s;
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void fuzz_rng_seed(fuzz_rng *r, const uint8_t *data, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    for (size_t i = 0; i < n; i++) h = mix(h ^ data[i]);
    r->s = h;
}

uint64_t fuzz_rng_next(fuzz_rng *r) { return mix(r->s += 0x9e3779b97f4a7c15ULL); }
