#include "util/npy.h"
#include "util/error.h"
#include "util/fileio.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols, dsv4_error *err) {
    char hdr[128];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     (long long)rows, (long long)cols);
    /* magic(6) + version(2) + len(2) + header, padded with spaces to a multiple of 64, ending in '\n' */
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    int hlen = n + pad + 1;
    size_t bytes = (size_t)(10 + hlen) + sizeof(float) * (size_t)(rows * cols);
    unsigned char *buf = malloc(bytes);
    if (!buf) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    memcpy(buf + 10, hdr, (size_t)n);
    memset(buf + 10 + n, ' ', (size_t)pad);
    buf[10 + n + pad] = '\n';
    memcpy(buf + 10 + hlen, data, sizeof(float) * (size_t)(rows * cols));
    int rc = dsv4_write_file_atomic(path, buf, bytes, err);
    free(buf);
    return rc;
}

int npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols, dsv4_error *err) {
    char *buf;
    size_t len;
    int rc = dsv4_read_file(path, &buf, &len, err);
    if (rc) return rc;
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6)) { free(buf); return dsv4_fail(err, DSV4_E_FORMAT, "%s: not a .npy file", path); }
    size_t hlen, off;
    if (buf[6] == 1) { hlen = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8); off = 10; }
    else { hlen = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8) | ((size_t)(unsigned char)buf[10] << 16) |
                  ((size_t)(unsigned char)buf[11] << 24); off = 12; }
    if (off + hlen > len) { free(buf); return dsv4_fail(err, DSV4_E_FORMAT, "%s: truncated header", path); }
    char hdr[512];
    snprintf(hdr, sizeof hdr, "%.*s", (int)(hlen < 511 ? hlen : 511), buf + off);
    if (!strstr(hdr, "'<f4'") || strstr(hdr, "'fortran_order': True")) {
        free(buf);
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: only little-endian float32 C-order arrays are supported", path);
    }
    const char *sh = strstr(hdr, "'shape': (");
    long long dims[2] = {1, 1};
    int nd = 0;
    if (sh) {
        const char *p = sh + 10;
        while (*p && *p != ')' && nd < 3) {
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p) break;
            if (nd < 2) dims[nd] = v;
            nd++;
            p = end;
            while (*p == ',' || *p == ' ') p++;
        }
    }
    if (nd < 1 || nd > 2) { free(buf); return dsv4_fail(err, DSV4_E_FORMAT, "%s: expected a 1-D or 2-D array", path); }
    long long r = nd == 2 ? dims[0] : 1, c = nd == 2 ? dims[1] : dims[0];
    size_t need = (size_t)(r * c) * sizeof(float);
    if (r < 0 || c < 0 || off + hlen + need > len) { free(buf); return dsv4_fail(err, DSV4_E_FORMAT, "%s: truncated data", path); }
    *data = malloc(need ? need : 1);
    if (!*data) { free(buf); return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); }
    memcpy(*data, buf + off + hlen, need);
    *rows = r;
    *cols = c;
    free(buf);
    return 0;
}
