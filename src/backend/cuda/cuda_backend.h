/* The CUDA backend as the rest of the engine sees it (DESIGN §8). Four calls: is there a GPU, upload a loaded
 * model's weights, run one step, release. Everything else — kernels, device memory, the step's launch
 * sequence — is private to src/backend/cuda/. A build without CUDA (plain `make`) links cuda_stub.c instead,
 * whose calls fail with one clear line. */
#ifndef DSV4_BACKEND_CUDA_H
#define DSV4_BACKEND_CUDA_H
#include "dsv4.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dsv4_model;

/* 1 when this build has the backend and device `gpu` is usable; else 0 and the reason in why. */
int  cuda_available(int gpu, dsv4_error *why);
/* Upload every weight of m (in its checkpoint format) to GPU `gpu` and make new sequences of m keep their state
 * there (m->cuda, m->state_mem). Says how many bytes it needs before allocating; on any error nothing stays
 * allocated and m is unchanged. */
int  cuda_model_init(struct dsv4_model *m, int gpu, dsv4_error *err);
void cuda_model_free(struct dsv4_model *m);
/* dsv4_step on the GPU: the same validation and errors as the CPU step, then the whole forward on the device. */
int  cuda_step(struct dsv4_model *m, dsv4_step_item *items, int n_items, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
