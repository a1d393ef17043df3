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
    const void *data;      /* points into the shard's bytes (its mapping or copy) */
    size_t      nbytes;
    int         shard;     /* index into st_archive.shards */
} st_tensor;

typedef struct {
    char  *path;
    void  *map;      /* the file mapping, or its copy (copied) */
    size_t len;
    int    copied;   /* map is a bigmem copy (st_copy_shards) */
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
/* Where a checkpoint's bytes live while a CPU reads them (util/bigmem.h says why it matters):
 *   ST_MEM_MAP       the file mapping, each page faulted in on first use (what st_open_* give);
 *   ST_MEM_POPULATE  the file mapping, every page mapped at load (st_populate);
 *   ST_MEM_COPY      a copy in anonymous memory on 2 MiB pages (st_copy_shards). */
typedef enum { ST_MEM_MAP, ST_MEM_POPULATE, ST_MEM_COPY } st_memory;
/* DSV4_WEIGHT_MEMORY=map|populate|copy, else (unset) copy when `bytes` take at most three quarters of the machine's
 * memory (a copy larger than that would push itself out; the file's page cache is reclaimable) and map otherwise.
 * Another value is DSV4_E_ARG. */
int  st_memory_choose(uint64_t bytes, st_memory *out, dsv4_error *err);
const char *st_memory_name(st_memory m);    /* "map", "populate", "copy" (the variable's values) */
const char *st_memory_words(st_memory m);   /* the same in words, for messages */
/* Map the pages of [p, p + n) (inside a file mapping) now: madvise(MADV_POPULATE_READ), Linux 5.14+; elsewhere
 * nothing happens. A hint: the mapping works the same either way. */
void st_populate(const void *p, size_t n);
/* Replace every shard's file mapping by a copy in bigmem (huge pages), read with up to `threads` threads, and
 * repoint the tensors into it. On failure (out of memory, a read error, a file shorter than at open) the shards
 * that were not copied keep their mappings, every tensor stays valid, and the error says which file. */
int  st_copy_shards(st_archive *a, int threads, dsv4_error *err);
const st_tensor *st_find(const st_archive *a, const char *name);
int64_t st_numel(const st_tensor *t);
#endif
