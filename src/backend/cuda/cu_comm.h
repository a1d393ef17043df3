/* Collectives between the GPUs of one process (expert parallelism, cuda_ep.c), through NCCL: the narrow
 * interface the rest of the backend sees. NCCL is loaded at run time (dlopen) the first time more than one GPU
 * is asked for, so neither the build nor a one-GPU run needs it, and a machine without it gets one line.
 *
 * Every call enqueues one collective on every rank's stream (rank r = the r-th GPU given to cu_comm_open) and
 * returns without waiting; between begin and end, several calls become one NCCL group. */
#ifndef DSV4_CU_COMM_H
#define DSV4_CU_COMM_H
#include "backend/cuda/cu_kernels.h"
#include "dsv4.h"
#include <stddef.h>

typedef struct cu_comm cu_comm;

/* One communicator per GPU of gpus[0..n) (n >= 2, distinct ordinals). */
int  cu_comm_open(int n, const int *gpus, cu_comm **out, dsv4_error *err);
void cu_comm_close(cu_comm *c);
int  cu_comm_ranks(const cu_comm *c);

int  cu_comm_begin(cu_comm *c, dsv4_error *err);
int  cu_comm_end(cu_comm *c, dsv4_error *err);
/* bufs[r] = rank 0's bufs[0] (bytes bytes), for every rank r. */
int  cu_comm_broadcast(cu_comm *c, void *const *bufs, size_t bytes, const cu_stream *streams, dsv4_error *err);
/* Rank 0's bufs[0][i] = the sum over ranks of bufs[r][i] (n floats, fp32 additions). Exact as a gather when
 * every rank but one holds -0.0f at i: -0.0f is the one additive identity of IEEE arithmetic (x + -0 == x
 * for every x, +0 and -0 included), so the order NCCL adds in cannot matter. */
int  cu_comm_reduce_sum(cu_comm *c, float *const *bufs, size_t n, const cu_stream *streams, dsv4_error *err);
#endif
