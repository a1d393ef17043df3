/* Kernel timestamps from the CUPTI activity API (cuda_backend.h cuda_trace_*), for `dsv4 bench --kernel-trace`: every
 * kernel the GPU runs while a trace is open, graph nodes included, as it ran (not replayed alone, as under ncu).
 *
 * libcupti is loaded with dlopen when a trace begins, so the build and the binary do not depend on it; the few
 * declarations its ABI needs are written here (values and the kernel record's leading fields from cupti_activity.h,
 * CUDA 12-13: CUpti_ActivityKernel4 .. 10 share them, checked against CUDA 13.0's header: kind at 0, start at 16,
 * end at 24, name at 104).
 *
 * CUPTI hands its records over in buffers through two callbacks that take no context pointer, so the trace being
 * filled is the one static `open_trace` below: one trace at a time in a process (a second begin is an error). */
#ifdef DSV4_CUDA
#include "backend/cuda/cu_runtime.h"
#include "backend/cuda/cuda_backend.h"
#include "util/error.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CUPTI_KIND_KERNEL = 3, CUPTI_KIND_CONCURRENT_KERNEL = 10 };   /* CUpti_ActivityKind */
enum { CUPTI_SUCCESS = 0 };                                           /* CUptiResult */
enum { CUPTI_FLUSH_FORCED = 1 };                                       /* CUPTI_ACTIVITY_FLAG_FLUSH_FORCED */
enum { REC_START = 16, REC_END = 24, REC_NAME = 104 };                 /* the kernel record's fields (bytes) */
enum { TRACE_BUFFER = 8 << 20 };

typedef void (*cupti_request_fn)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*cupti_complete_fn)(void *context, uint32_t stream, uint8_t *buffer, size_t size, size_t valid);

typedef struct {
    void *lib;
    int (*register_callbacks)(cupti_request_fn, cupti_complete_fn);
    int (*enable)(int kind);
    int (*disable)(int kind);
    int (*flush_all)(uint32_t flag);
    int (*next_record)(uint8_t *buffer, size_t valid, void **record);
} cupti_api;

struct cuda_kernel_trace {
    cupti_api api;
    cuda_kernel_span *spans;
    size_t n, cap;
    char **names;              /* the distinct kernel names, owned (a span's name points into this list) */
    int n_names, cap_names;
    int failed;                /* out of memory while taking records: the trace is incomplete */
};

static cuda_kernel_trace *open_trace;
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;   /* CUPTI may complete buffers on its own threads */

/* A kernel's function name without its template arguments and parameters: from a mangled name (_Z<len><name>...,
 * _ZN<len><name>... for a nested one) the first identifier, else the text before '<' or '('. Into out (cap bytes). */
static void short_name(const char *name, char *out, size_t cap) {
    size_t n = 0;
    const char *p = name;
    if (p[0] == '_' && p[1] == 'Z') {
        p += 2;
        if (*p == 'N') p++;
        size_t len = 0;
        while (*p >= '0' && *p <= '9') len = 10 * len + (size_t)(*p++ - '0');
        for (; n < len && n + 1 < cap && p[n]; n++) out[n] = p[n];
    } else
        for (; n + 1 < cap && p[n] && p[n] != '<' && p[n] != '('; n++) out[n] = p[n];
    out[n] = 0;
    if (!n) snprintf(out, cap, "%.*s", (int)(cap - 1), name);
}

static const char *intern(cuda_kernel_trace *t, const char *full) {
    char name[96];
    short_name(full ? full : "?", name, sizeof name);
    for (int i = 0; i < t->n_names; i++)
        if (!strcmp(t->names[i], name)) return t->names[i];
    if (t->n_names == t->cap_names) {
        const int nc = t->cap_names ? 2 * t->cap_names : 64;
        char **nn = realloc(t->names, sizeof(char *) * (size_t)nc);
        if (!nn) return NULL;
        t->names = nn;
        t->cap_names = nc;
    }
    char *copy = strdup(name);
    if (!copy) return NULL;
    return t->names[t->n_names++] = copy;
}

static void take(cuda_kernel_trace *t, const uint8_t *rec) {
    uint64_t start, end;
    const char *name;
    memcpy(&start, rec + REC_START, sizeof start);
    memcpy(&end, rec + REC_END, sizeof end);
    memcpy(&name, rec + REC_NAME, sizeof name);
    if (t->n == t->cap) {
        const size_t nc = t->cap ? 2 * t->cap : 16384;
        cuda_kernel_span *ns = realloc(t->spans, sizeof *ns * nc);
        if (!ns) { t->failed = 1; return; }
        t->spans = ns;
        t->cap = nc;
    }
    const char *interned = intern(t, name);
    if (!interned) { t->failed = 1; return; }
    t->spans[t->n++] = (cuda_kernel_span){ start, end, interned };
}

static void on_request(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, TRACE_BUFFER);
    *size = *buffer ? TRACE_BUFFER : 0;
    *max_records = 0;
}

static void on_complete(void *context, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)context, (void)stream, (void)size;
    pthread_mutex_lock(&trace_lock);
    cuda_kernel_trace *t = open_trace;
    void *rec = NULL;
    while (t && buffer && t->api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
        int kind;
        memcpy(&kind, rec, sizeof kind);
        if (kind == CUPTI_KIND_KERNEL || kind == CUPTI_KIND_CONCURRENT_KERNEL) take(t, rec);
    }
    pthread_mutex_unlock(&trace_lock);
    free(buffer);
}

static int load(cupti_api *a, dsv4_error *err) {
    static const char *const names[] = { "libcupti.so", "libcupti.so.13", "libcupti.so.12", "/usr/local/cuda/lib64/libcupti.so",
                                         "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so" };
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !a->lib; i++) a->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "--kernel-trace: libcupti (CUDA's profiling library) is not on this machine");
    *(void **)&a->register_callbacks = dlsym(a->lib, "cuptiActivityRegisterCallbacks");
    *(void **)&a->enable = dlsym(a->lib, "cuptiActivityEnable");
    *(void **)&a->disable = dlsym(a->lib, "cuptiActivityDisable");
    *(void **)&a->flush_all = dlsym(a->lib, "cuptiActivityFlushAll");
    *(void **)&a->next_record = dlsym(a->lib, "cuptiActivityGetNextRecord");
    if (!a->register_callbacks || !a->enable || !a->disable || !a->flush_all || !a->next_record) {
        dlclose(a->lib);
        a->lib = NULL;
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "--kernel-trace: this libcupti lacks the activity API");
    }
    return 0;
}

int cuda_trace_begin(cuda_kernel_trace **out, dsv4_error *err) {
    *out = NULL;
    if (open_trace) return dsv4_fail(err, DSV4_E_STATE, "--kernel-trace: a trace is already open in this process");
    cuda_kernel_trace *t = calloc(1, sizeof *t);
    if (!t) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    int rc = load(&t->api, err);
    if (!rc && t->api.register_callbacks(on_request, on_complete) != CUPTI_SUCCESS)
        rc = dsv4_fail(err, DSV4_E_UNSUPPORTED, "--kernel-trace: CUPTI refused its buffer callbacks");
    if (rc) {
        cuda_trace_free(t);
        return rc;
    }
    pthread_mutex_lock(&trace_lock);
    open_trace = t;   /* before the first record can arrive */
    pthread_mutex_unlock(&trace_lock);
    if (t->api.enable(CUPTI_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        pthread_mutex_lock(&trace_lock);
        open_trace = NULL;
        pthread_mutex_unlock(&trace_lock);
        cuda_trace_free(t);
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "--kernel-trace: CUPTI cannot record kernels here (another profiler attached?)");
    }
    *out = t;
    return 0;
}

int cuda_trace_end(cuda_kernel_trace *t, dsv4_error *err) {
    if (!t || t != open_trace) return dsv4_fail(err, DSV4_E_STATE, "--kernel-trace: no such open trace");
    const int synced = cu_sync();   /* every kernel launched so far has ended: its record exists */
    t->api.disable(CUPTI_KIND_CONCURRENT_KERNEL);
    t->api.flush_all(CUPTI_FLUSH_FORCED);   /* the callbacks run before it returns */
    pthread_mutex_lock(&trace_lock);
    open_trace = NULL;
    pthread_mutex_unlock(&trace_lock);
    if (synced) return dsv4_fail(err, DSV4_E_STATE, "--kernel-trace: CUDA error waiting for the GPU");
    if (t->failed) return dsv4_fail(err, DSV4_E_NOMEM, "--kernel-trace: out of memory while taking the records");
    return 0;
}

size_t cuda_trace_spans(const cuda_kernel_trace *t, const cuda_kernel_span **spans) {
    *spans = t ? t->spans : NULL;
    return t ? t->n : 0;
}

void cuda_trace_free(cuda_kernel_trace *t) {
    if (!t) return;
    if (t == open_trace) {
        dsv4_error ignored;
        cuda_trace_end(t, &ignored);
    }
    /* libcupti stays loaded: CUPTI keeps its callbacks registered for the life of the process */
    for (int i = 0; i < t->n_names; i++) free(t->names[i]);
    free(t->names);
    free(t->spans);
    free(t);
}
#else
typedef int dsv4_cu_trace_unused; /* ISO C wants a translation unit to declare something */
#endif
