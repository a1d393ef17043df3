/* Safetensors reader: memory-maps every shard of a checkpoint folder and indexes its tensors by name.
 * Format: u64 little-endian header length, JSON header {name: {dtype, shape, data_offsets}}, raw data. */
#ifndef DSV4_MODEL_SAFETENSORS_H
#define DSV4_MODEL_SAFETENSORS_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

typedef enum {
    ST_BF16, ST_F16, ST_F32, ST_F64, ST_F8_E4M3, ST_F8_E8M0, ST_I8, ST_U8, ST_I16, ST_I32, ST_I64, ST_BOOL,
    ST_N_DTYPES
} st_dtype;

const char *st_dtype_name(st_dtype d);
int         st_dtype_size(st_dtype d);
int         st_dtype_parse(const char *s, st_dtype *out);  /* 0 on success */

#define ST_MAX_DIMS 4

typedef struct {
    char       *name;
    st_dtype    dtype;
    int         ndim;
    int64_t     shape[ST_MAX_DIMS];
    const void *data;      /* points into the shard's mapping */
    size_t      nbytes;
    int         shard;     /* index into st_archive.shards */
} st_tensor;

typedef struct {
    char  *path;
    void  *map;
    size_t len;
} st_shard;

typedef struct {
    st_shard  *shards;
    int        n_shards;
    st_tensor *tensors;    /* sorted by name */
    int        n_tensors;
} st_archive;

/* Open <dir>/model.safetensors.index.json + its shards, or <dir>/model.safetensors. Validates every header:
 * JSON shape, known dtypes, offsets inside the file, byte counts equal to the shape, no overlaps out of
 * range, every tensor of the index present in the shard it names. */
int  st_open_dir(const char *dir, st_archive *a, dsv4_error *err);
/* Open one file. */
int  st_open_file(const char *path, st_archive *a, dsv4_error *err);
void st_close(st_archive *a);
const st_tensor *st_find(const st_archive *a, const char *name);
int64_t st_numel(const st_tensor *t);
#endif
