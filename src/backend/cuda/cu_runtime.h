/* Device memory, streams and errors for the CUDA backend (cu_runtime.cu), as C calls. */
#ifndef DSV4_CU_RUNTIME_H
#define DSV4_CU_RUNTIME_H
#include "backend/cuda/cu_kernels.h"
#include "dsv4.h"
#include "state/statemem.h"
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Select GPU `gpu` for this thread; 0, or a DSV4_E_UNSUPPORTED failure saying why (no driver, no device,
 * not Hopper). */
int  cu_select(int gpu, dsv4_error *err);
/* Make GPU `gpu` (already checked by cu_select) this thread's current device: every launch and allocation goes
 * to the current device, and a model's step may run on any thread. */
void cu_use(int gpu);
/* Bytes free and in total on the current GPU. */
void cu_mem_info(size_t *free_bytes, size_t *total_bytes);
void *cu_malloc(size_t bytes);                      /* NULL when out of memory (the error is cleared) */
void cu_free(void *p);
int  cu_upload(void *dst, const void *src, size_t n);   /* synchronous copies: 0 or -1 */
int  cu_download(void *dst, const void *src, size_t n);
int  cu_zero(void *dst, size_t n);
int  cu_fill_bytes(void *dst, int byte, size_t n);   /* every byte = byte */
int  cu_sync(void);                                    /* wait for the current GPU: 0 or -1 */
/* Page-locked host memory (copies to and from it run asynchronously on a stream); NULL when it cannot be had. */
void *cu_malloc_host(size_t bytes);
void cu_free_host(void *p);
/* Page-locked host memory that kernels may also read and write by the same pointer (mapped, portable: unified
 * addressing); freed by cu_free_host. NULL when it cannot be had. */
void *cu_malloc_mapped(size_t bytes);
/* Host memory allocated elsewhere (p, n bytes) page-locked and mapped the same way, keeping its pages (huge pages
 * stay huge for the host's own reads): 0, or -1 when it cannot be (nothing registered). Undone by cu_host_unregister
 * before p is freed. */
int  cu_host_register_mapped(void *p, size_t n);
void cu_host_unregister(void *p);
/* Copies enqueued on st (host side page-locked): 0 or -1. */
int  cu_upload_async(cu_stream st, void *dst, const void *src, size_t n);
int  cu_download_async(cu_stream st, void *dst, const void *src, size_t n);
/* Events: a point in a stream the host can wait for. */
typedef void *cu_event;
cu_event cu_event_new(void);
void cu_event_free(cu_event ev);
int  cu_event_record(cu_event ev, cu_stream st);
int  cu_event_wait_host(cu_event ev);      /* the host waits until the stream has passed the event: 0 or -1 */
int  cu_stream_wait(cu_stream st, cu_event ev);   /* st's later work waits until ev has passed (inside a capture: an edge) */
cu_stream cu_stream_new(void);
void cu_stream_free(cu_stream st);
int  cu_stream_poll(cu_stream st);   /* without waiting: 1 = everything enqueued on st has run, 0 = not yet, -1 = a CUDA error */
/* Wait for st and report any launch or execution error as one line (what: the failing stage). */
int  cu_finish(cu_stream st, const char *what, dsv4_error *err);
void cu_device_name(char *out, size_t n);

/* Device-to-device copy bandwidth (bytes read + written per second, best of reps), GB/s; -1 on failure. */
double cu_copy_bandwidth_gbs(size_t bytes, int reps);

/* Sequence state in GPU memory (statemem.h); copies are synchronous with respect to every step. */
extern const seq_mem seq_mem_cuda;

#ifdef __cplusplus
}
#endif
#endif
