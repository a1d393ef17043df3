/* NumPy .npy files of float32, C order, 1-D or 2-D: the format of golden logits and of `dsv4 logits --out`. */
#ifndef DSV4_UTIL_NPY_H
#define DSV4_UTIL_NPY_H
#include "dsv4.h"
#include <stdint.h>

int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols, dsv4_error *err);
/* Read a '<f4' C-order array of 1 or 2 dimensions (1-D arrays come back as 1 x n). Caller frees *data. */
int npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols, dsv4_error *err);
#endif
