/* Whole-file helpers. */
#ifndef DSV4_UTIL_FILEIO_H
#define DSV4_UTIL_FILEIO_H
#include "dsv4.h"
#include <stddef.h>

/* Read a whole file into a NUL-terminated heap buffer (caller frees). */
int dsv4_read_file(const char *path, char **out, size_t *len, dsv4_error *err);
/* Write a file atomically: write <path>.tmp.<pid>, fsync, rename over path. */
int dsv4_write_file_atomic(const char *path, const void *data, size_t len, dsv4_error *err);
#endif
