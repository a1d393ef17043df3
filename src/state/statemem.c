#include "state/statemem.h"
#include <stdlib.h>
#include <string.h>

static void *host_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }
static void host_release(void *p) { free(p); }
static void host_copy(void *dst, const void *src, size_t n) { if (n) memcpy(dst, src, n); }

const seq_mem seq_mem_host = { "cpu", host_alloc, host_release, host_copy, host_copy, host_copy };

void *seq_mem_grow(const seq_mem *m, void *p, size_t old_bytes, size_t new_bytes) {
    void *np = m->alloc(new_bytes);
    if (!np) return NULL;
    if (p && old_bytes) m->copy(np, p, old_bytes < new_bytes ? old_bytes : new_bytes);
    m->release(p);
    return np;
}
