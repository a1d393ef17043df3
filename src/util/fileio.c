#include "util/fileio.h"
#include "util/error.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int dsv4_read_file(const char *path, char **out, size_t *len, dsv4_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return dsv4_fail(err, DSV4_E_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 65536 * 2;
            char *nb = realloc(buf, nc);
            if (!nb) { free(buf); fclose(f); return dsv4_fail(err, DSV4_E_NOMEM, "%s: out of memory", path); }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return dsv4_fail(err, DSV4_E_IO, "%s: read error", path); }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int dsv4_write_file_atomic(const char *path, const void *data, size_t len, dsv4_error *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return dsv4_fail(err, DSV4_E_IO, "%s: %s", tmp, strerror(errno));
    int ok = fwrite(data, 1, len, f) == len;
    ok = (fflush(f) == 0) && ok;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return dsv4_fail(err, DSV4_E_IO, "%s: %s", path, strerror(e));
    }
    return 0;
}
