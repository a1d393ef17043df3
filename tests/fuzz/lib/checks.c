#include "checks.h"
#include "../fuzz.h"
#include <string.h>

void fuzz_check_archive(const st_archive *a) {
    for (int i = 0; i < a->n_tensors; i++) {
        const st_tensor *t = &a->tensors[i];
        FUZZ_CHECK(t->shard >= 0 && t->shard < a->n_shards, "tensor %s: shard %d", t->name, t->shard);
        const st_shard *sh = &a->shards[t->shard];
        const char *lo = (const char *)sh->map, *p = (const char *)t->data;
        FUZZ_CHECK(lo && p >= lo + 8 && t->nbytes <= sh->len && (size_t)(p - lo) <= sh->len - t->nbytes,
                   "tensor %s: data outside its shard", t->name);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "tensor %s: %d dims", t->name, t->ndim);
        FUZZ_CHECK((uint64_t)st_numel(t) * (uint64_t)st_dtype_size(t->dtype) == t->nbytes, "tensor %s: size", t->name);
        FUZZ_CHECK(i == 0 || strcmp(a->tensors[i - 1].name, t->name) < 0, "tensors not sorted / unique");
        FUZZ_CHECK(st_find(a, t->name) == t, "st_find misses %s", t->name);
        /* touch the first and last byte, so a bad pointer faults here rather than in a kernel later */
        if (t->nbytes) { volatile char c = p[0]; c = p[t->nbytes - 1]; (void)c; }
    }
}
