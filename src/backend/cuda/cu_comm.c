/* NCCL behind cu_comm.h, loaded with dlopen. The few declarations NCCL's ABI needs are written here (values from
 * nccl.h, stable across NCCL 2.x) so that the build does not depend on nccl.h being installed. */
#ifdef DSV4_CUDA
#include "backend/cuda/cu_comm.h"
#include "util/error.h"
#include <dlfcn.h>
#include <stdlib.h>

typedef struct nccl_comm *nccl_comm_t;
typedef int nccl_result;                  /* ncclResult_t: 0 = ncclSuccess */
enum { NCCL_UINT8 = 1, NCCL_FLOAT32 = 7 };/* ncclDataType_t */
enum { NCCL_SUM = 0 };                    /* ncclRedOp_t */

typedef struct {
    void *lib;
    nccl_result (*init_all)(nccl_comm_t *comms, int n, const int *devs);
    nccl_result (*destroy)(nccl_comm_t comm);
    nccl_result (*group_start)(void);
    nccl_result (*group_end)(void);
    nccl_result (*broadcast)(const void *send, void *recv, size_t count, int type, int root, nccl_comm_t comm, void *stream);
    nccl_result (*reduce)(const void *send, void *recv, size_t count, int type, int op, int root, nccl_comm_t comm, void *stream);
    const char *(*error_string)(nccl_result r);
    nccl_result (*version)(int *v);
} nccl_api;

struct cu_comm {
    nccl_api api;
    int n;
    nccl_comm_t *comms;
};

static int load_nccl(nccl_api *a, dsv4_error *err) {
    const char *env = getenv("DSV4_NCCL");
    const char *names[] = { env, "libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2" };
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !a->lib; i++)
        if (names[i] && *names[i]) a->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!a->lib)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "more than one GPU needs NCCL, and libnccl.so.2 was not found "
                         "(install NCCL, or name the library in DSV4_NCCL)");
#define SYM(field, name) if (!(*(void **)&a->field = dlsym(a->lib, name))) goto missing
    SYM(init_all, "ncclCommInitAll");
    SYM(destroy, "ncclCommDestroy");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(broadcast, "ncclBroadcast");
    SYM(reduce, "ncclReduce");
    SYM(error_string, "ncclGetErrorString");
    SYM(version, "ncclGetVersion");
#undef SYM
    return 0;
missing:
    dlclose(a->lib);
    a->lib = NULL;
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "the NCCL library found lacks the functions dsv4 needs (NCCL 2.x)");
}

static int nccl_check(const cu_comm *c, nccl_result r, const char *what, dsv4_error *err) {
    if (r == 0) return 0;
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "NCCL %s failed: %s", what, c->api.error_string(r));
}

int cu_comm_open(int n, const int *gpus, cu_comm **out, dsv4_error *err) {
    *out = NULL;
    if (n < 2) return dsv4_fail(err, DSV4_E_ARG, "cu_comm_open: %d ranks (at least 2)", n);
    cu_comm *c = calloc(1, sizeof *c);
    if (!c || !(c->comms = calloc((size_t)n, sizeof *c->comms))) {
        free(c);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    c->n = n;
    int rc = load_nccl(&c->api, err);
    /* NVLink SHARP (multicast) stays off: these machines are shared and the collectives here do not need it */
    if (!rc) setenv("NCCL_NVLS_ENABLE", "0", 0);
    if (!rc) rc = nccl_check(c, c->api.init_all(c->comms, n, gpus), "communicator setup", err);
    if (rc) {
        if (c->api.lib) dlclose(c->api.lib);
        free(c->comms);
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void cu_comm_close(cu_comm *c) {
    if (!c) return;
    for (int r = 0; r < c->n; r++)
        if (c->comms[r]) c->api.destroy(c->comms[r]);
    /* the library stays loaded: NCCL keeps process-wide state that outlives its communicators */
    free(c->comms);
    free(c);
}

int cu_comm_ranks(const cu_comm *c) { return c->n; }

int cu_comm_begin(cu_comm *c, dsv4_error *err) { return nccl_check(c, c->api.group_start(), "group start", err); }
int cu_comm_end(cu_comm *c, dsv4_error *err) { return nccl_check(c, c->api.group_end(), "group", err); }

int cu_comm_broadcast(cu_comm *c, void *const *bufs, size_t bytes, const cu_stream *streams, dsv4_error *err) {
    int rc = cu_comm_begin(c, err);
    for (int r = 0; r < c->n && !rc; r++)
        rc = nccl_check(c, c->api.broadcast(bufs[0], bufs[r], bytes, NCCL_UINT8, 0, c->comms[r], streams[r]), "broadcast", err);
    const int rc_end = cu_comm_end(c, rc ? NULL : err);
    return rc ? rc : rc_end;
}

int cu_comm_reduce_sum(cu_comm *c, float *const *bufs, size_t n, const cu_stream *streams, dsv4_error *err) {
    int rc = cu_comm_begin(c, err);
    for (int r = 0; r < c->n && !rc; r++)
        rc = nccl_check(c, c->api.reduce(bufs[r], bufs[r], n, NCCL_FLOAT32, NCCL_SUM, 0, c->comms[r], streams[r]), "reduce", err);
    const int rc_end = cu_comm_end(c, rc ? NULL : err);
    return rc ? rc : rc_end;
}
#else
typedef int dsv4_cu_comm_unused; /* built only with CUDA=1 */
#endif
