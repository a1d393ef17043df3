/* Safetensors writer: the counterpart of safetensors.h, used by `dsv4 tiny` and by synthetic benchmarks.
 *
 * A file is: u64 little-endian header length, a JSON header (`__metadata__` first, then one entry per tensor
 * in the caller's order, with packed data_offsets), padded with spaces to a multiple of 8, then the raw data.
 * Tensor bytes are produced one tensor at a time by a caller-supplied fill callback, so a checkpoint larger
 * than memory can be written (peak memory = the largest tensor). Every file is written to a temporary name,
 * fsynced and renamed into place, so a reader never sees a half-written shard. */
#ifndef DSV4_MODEL_SAFETENSORS_WRITE_H
#define DSV4_MODEL_SAFETENSORS_WRITE_H
#include "model/safetensors.h"
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;
    st_dtype    dtype;
    int         ndim;
    int64_t     shape[ST_MAX_DIMS];
    int         hole;     /* 1: not filled; left as a hole of the sparse file (zeros), see model/synthetic.h */
} st_write_tensor;

/* Write the bytes of tensors[index] into buf: exactly nbytes (= numel x dtype size) bytes, little-endian. */
typedef int (*st_fill_fn)(void *user, int index, void *buf, size_t nbytes, dsv4_error *err);

size_t st_write_nbytes(const st_write_tensor *t);

/* One safetensors file holding tensors[first .. first+count-1]; fill is called with the global index. */
int st_write_file(const char *path, const st_write_tensor *tensors, int first, int count, st_fill_fn fill,
                  void *user, dsv4_error *err);

/* The Hugging Face sharded layout in `dir` (which must exist): model-0000K-of-0000N.safetensors for K = 1..N,
 * tensors split in order into N contiguous runs of about equal bytes, plus model.safetensors.index.json
 * ({"metadata":{"total_size":...},"weight_map":{name: shard}}), written last. */
int st_write_sharded(const char *dir, const st_write_tensor *tensors, int n, int n_shards, st_fill_fn fill,
                     void *user, dsv4_error *err);

/* File name of shard k (0-based) of n, e.g. "model-00001-of-00002.safetensors". */
void st_shard_name(char *buf, size_t len, int k, int n);
#endif
