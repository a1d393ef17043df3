/* A build without the CUDA backend (plain `make`): asking for the GPU is an error with one clear line. */
#ifndef DSV4_CUDA
#include "backend/cuda/cuda_backend.h"
#include "util/error.h"

static int no_cuda(dsv4_error *err) {
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "this build of dsv4 has no CUDA backend (rebuild with `make CUDA=1`)");
}

int cuda_available(int gpu, dsv4_error *why) {
    (void)gpu;
    no_cuda(why);
    return 0;
}
int cuda_model_init(struct dsv4_model *m, int gpu, dsv4_error *err) {
    (void)m; (void)gpu;
    return no_cuda(err);
}
void cuda_model_free(struct dsv4_model *m) { (void)m; }
int cuda_step(struct dsv4_model *m, dsv4_step_item *items, int n_items, dsv4_error *err) {
    (void)m; (void)items; (void)n_items;
    return no_cuda(err);
}
#else
typedef int dsv4_cuda_stub_unused; /* ISO C wants a translation unit to declare something */
#endif
