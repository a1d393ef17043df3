/* Device memory, streams and errors. Every allocation is a plain cudaMalloc (no managed memory); running out
 * is reported to the caller, who turns it into a one-line error before any state changes. */
#include "backend/cuda/cu_runtime.h"
extern "C" {
#include "util/error.h"
}
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" int cu_select(int gpu, dsv4_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "no usable CUDA GPU: %s", cudaGetErrorString(e));
    }
    if (gpu < 0 || gpu >= n) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "no CUDA GPU %d (this machine has %d)", gpu, n);
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, gpu)) != cudaSuccess || (e = cudaSetDevice(gpu)) != cudaSuccess) {
        cudaGetLastError();
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "CUDA GPU %d is not usable: %s", gpu, cudaGetErrorString(e));
    }
    if (prop.major != 9)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "CUDA GPU %d (%s) has compute capability %d.%d; this build runs on Hopper (9.0)",
                         gpu, prop.name, prop.major, prop.minor);
    return 0;
}

extern "C" void cu_use(int gpu) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != gpu) cudaSetDevice(gpu);
}

extern "C" void cu_device_name(char *out, size_t n) {
    cudaDeviceProp prop;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) snprintf(out, n, "unknown GPU");
    else snprintf(out, n, "%s", prop.name);
}

extern "C" void cu_mem_info(size_t *free_bytes, size_t *total_bytes) {
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
        cudaGetLastError();
        *free_bytes = *total_bytes = 0;
    }
}

extern "C" void *cu_malloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();   /* out of memory is not sticky: clear it so the next call works */
        return NULL;
    }
    return p;
}

extern "C" void cu_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" int cu_upload(void *dst, const void *src, size_t n) {
    return n && cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice) != cudaSuccess ? -1 : 0;
}
extern "C" int cu_download(void *dst, const void *src, size_t n) {
    return n && cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost) != cudaSuccess ? -1 : 0;
}
extern "C" int cu_zero(void *dst, size_t n) { return n && cudaMemset(dst, 0, n) != cudaSuccess ? -1 : 0; }
extern "C" int cu_fill_bytes(void *dst, int byte, size_t n) { return n && cudaMemset(dst, byte, n) != cudaSuccess ? -1 : 0; }
extern "C" int cu_sync(void) { return cudaDeviceSynchronize() != cudaSuccess ? -1 : 0; }

extern "C" void *cu_malloc_host(size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}
extern "C" void *cu_malloc_mapped(size_t bytes) {
    void *p = NULL, *d = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
        cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess || d != p) {
        cudaGetLastError();
        if (p) cudaFreeHost(p);
        return NULL;
    }
    return p;
}
extern "C" int cu_host_register_mapped(void *p, size_t n) {
    void *d = NULL;
    if (cudaHostRegister(p, n, cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess || d != p) {
        cudaGetLastError();
        cudaHostUnregister(p);
        return -1;
    }
    return 0;
}
extern "C" void cu_host_unregister(void *p) {
    if (p) cudaHostUnregister(p);
}
extern "C" void cu_free_host(void *p) {
    if (p) cudaFreeHost(p);
}
extern "C" int cu_upload_async(cu_stream st, void *dst, const void *src, size_t n) {
    return n && cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, (cudaStream_t)st) != cudaSuccess ? -1 : 0;
}
extern "C" int cu_download_async(cu_stream st, void *dst, const void *src, size_t n) {
    return n && cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, (cudaStream_t)st) != cudaSuccess ? -1 : 0;
}
extern "C" cu_event cu_event_new(void) {
    cudaEvent_t e = NULL;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return NULL;
    return (cu_event)e;
}
extern "C" void cu_event_free(cu_event ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
extern "C" int cu_event_record(cu_event ev, cu_stream st) {
    return cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)st) != cudaSuccess ? -1 : 0;
}
extern "C" int cu_event_wait_host(cu_event ev) { return cudaEventSynchronize((cudaEvent_t)ev) != cudaSuccess ? -1 : 0; }
extern "C" int cu_stream_wait(cu_stream st, cu_event ev) {
    return cudaStreamWaitEvent((cudaStream_t)st, (cudaEvent_t)ev, 0) != cudaSuccess ? -1 : 0;
}

extern "C" cu_stream cu_stream_new(void) {
    cudaStream_t s = NULL;
    /* a blocking stream: ordered with the legacy default stream that state copies use */
    if (cudaStreamCreate(&s) != cudaSuccess) return NULL;
    return (cu_stream)s;
}
extern "C" void cu_stream_free(cu_stream st) {
    if (st) cudaStreamDestroy((cudaStream_t)st);
}

extern "C" int cu_stream_poll(cu_stream st) {
    const cudaError_t e = cudaStreamQuery((cudaStream_t)st);
    return e == cudaSuccess ? 1 : e == cudaErrorNotReady ? 0 : -1;
}

extern "C" int cu_finish(cu_stream st, const char *what, dsv4_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)st);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) return dsv4_fail(err, DSV4_E_STATE, "CUDA error in %s: %s", what, cudaGetErrorString(e));
    return 0;
}

extern "C" double cu_copy_bandwidth_gbs(size_t bytes, int reps) {
    void *a = cu_malloc(bytes), *b = cu_malloc(bytes);
    double best = -1;
    cudaEvent_t e0, e1;
    if (a && b && cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
        cudaMemset(a, 1, bytes);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);   /* warm-up */
        for (int r = 0; r < reps; r++) {
            cudaEventRecord(e0);
            cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            const double gbs = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;   /* bytes read + bytes written */
            if (gbs > best) best = gbs;
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cudaGetLastError();
    cu_free(a);
    cu_free(b);
    return best;
}

/* ---- sequence state memory ------------------------------------------------------------------------------------ */

static void *state_alloc(size_t bytes) {
    void *p = cu_malloc(bytes);
    if (p && cudaMemset(p, 0, bytes ? bytes : 1) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}
static void state_copy(void *dst, const void *src, size_t n) {
    if (n) cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice);
}
static void state_to_host(void *host, const void *src, size_t n) {
    if (n) cudaMemcpy(host, src, n, cudaMemcpyDeviceToHost);
}
static void state_from_host(void *dst, const void *host, size_t n) {
    if (n) cudaMemcpy(dst, host, n, cudaMemcpyHostToDevice);
}

extern "C" const seq_mem seq_mem_cuda = { "cuda", state_alloc, cu_free, state_copy, state_to_host, state_from_host };
