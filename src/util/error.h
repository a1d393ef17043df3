/* Error reporting: every fallible function returns a dsv4_status and fills a dsv4_error. */
#ifndef DSV4_UTIL_ERROR_H
#define DSV4_UTIL_ERROR_H
#include "dsv4.h"

/* Format a message into err (if non-NULL) and return code. Use as `return dsv4_fail(err, DSV4_E_IO, ...)`. */
int dsv4_fail(dsv4_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prefix an existing message with context: "loading X: <old message>". Returns err->code. */
int dsv4_wrap(dsv4_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *dsv4_status_name(int code);
#endif
