#include "util/error.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Messages quote what they complain about (a field value, a regex, a tensor name), and that text may contain
 * line breaks; a message is one line (DESIGN §7), so every control character but tab becomes a space.
 * (Found by tests/fuzz/fuzz_tokenizer_load.c: a pre-tokenizer regex with a newline in it.) */
static void one_line(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 && *s != '\t') *s = ' ';
}

int dsv4_fail(dsv4_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        one_line(err->msg);
        err->code = code;
    }
    return code;
}

int dsv4_wrap(dsv4_error *err, const char *fmt, ...) {
    if (!err) return DSV4_E_ARG;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    one_line(err->msg);
    return err->code;
}

const char *dsv4_status_name(int code) {
    switch (code) {
    case DSV4_OK: return "ok";
    case DSV4_E_ARG: return "invalid argument";
    case DSV4_E_IO: return "i/o error";
    case DSV4_E_FORMAT: return "malformed file";
    case DSV4_E_MODEL: return "checkpoint mismatch";
    case DSV4_E_NOMEM: return "out of memory";
    case DSV4_E_RANGE: return "out of range";
    case DSV4_E_UNSUPPORTED: return "unsupported";
    case DSV4_E_STATE: return "state mismatch";
    }
    return "unknown error";
}
