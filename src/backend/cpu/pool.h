/* A fixed pool of worker threads for data-parallel loops, and the kernel set (isa.h) the CPU backend runs on them.
 * Work is split into contiguous ranges, one per thread (dsv4_pool_run) or blocks taken in turn
 * (dsv4_pool_run_blocks); which thread computes an element, and in which range, never changes a result: every
 * element is computed by the same code with the same summation order whatever the thread count or the cut. */
#ifndef DSV4_CPU_POOL_H
#define DSV4_CPU_POOL_H

typedef struct dsv4_pool dsv4_pool;
struct cpu_kernels;

/* fn(ctx, begin, end, thread): process items [begin, end) on worker `thread` (0..n_threads-1). */
typedef void (*dsv4_range_fn)(void *ctx, int begin, int end, int thread);

/* n_threads <= 0: one per online CPU. NULL on failure. The pool runs the best kernel set of this CPU (isa.h)
 * until dsv4_pool_set_kernels says otherwise. */
dsv4_pool *dsv4_pool_new(int n_threads);
void       dsv4_pool_free(dsv4_pool *p);
int        dsv4_pool_threads(const dsv4_pool *p);
/* The instruction set whose kernels this pool's linears run (set before any job, not while one runs). */
const struct cpu_kernels *dsv4_pool_kernels(const dsv4_pool *p);
void       dsv4_pool_set_kernels(dsv4_pool *p, const struct cpu_kernels *k);
/* How long (microseconds) a worker that finished a job spins for the next one before it sleeps on a condition variable
 * (default 200): waking a sleeper costs tens of microseconds, spinning costs its core. Takes effect at each worker's
 * next wait. */
void       dsv4_pool_set_spin(dsv4_pool *p, int us);
/* How many of the threads take part in the jobs from the next one on: 1 .. dsv4_pool_threads (clamped; default all).
 * The others sleep until the width grows again, leaving their cores to other threads (a step enqueued ahead on the GPU:
 * its enqueuing thread needs a core of its own, backend/cuda/cuda_host_experts.c). Not while a job runs. */
void       dsv4_pool_set_width(dsv4_pool *p, int width);
int        dsv4_pool_width(const dsv4_pool *p);
/* Run fn over [0, n) split across the threads of the width (fn's thread < the width); returns when all are done.
 * Not reentrant. */
void       dsv4_pool_run(dsv4_pool *p, int n, dsv4_range_fn fn, void *ctx);
/* The same in blocks of `block` items (the last one shorter): each thread owns an equal contiguous run of blocks
 * and takes them in order, then takes what is left of the others' runs, so that a thread slowed by its core (a busy
 * hyperthread sibling, another process) ends up with fewer, while on a quiet machine each thread streams its own
 * range as with equal shares. For loops whose results do not depend on how [0, n) is cut. With one thread, or n <=
 * block, the caller runs [0, n) in one call. */
void       dsv4_pool_run_blocks(dsv4_pool *p, int n, int block, dsv4_range_fn fn, void *ctx);

/* Where a pool's time goes, while counting is on (dsv4 bench): the caller's time inside dsv4_pool_run and, of it,
 * after its own share (waiting for the slowest worker); the workers' time computing their shares, and from a job's
 * start to their starting on it (spinning or asleep before it). Times in seconds; worker sums over all workers. */
typedef struct {
    long long jobs;         /* dispatches (a loop run inline, one thread or one item, counts too) */
    long long shared;       /* of them, those the workers took part in */
    double in_run;          /* caller: inside dsv4_pool_run */
    double caller_wait;     /* caller: after its share, until the last worker finished */
    double worker_busy;     /* workers: in fn */
    double worker_wake;     /* workers: job start to their start on it */
    double worker_span;     /* the jobs' times, each times its workers (its width - 1): what worker_busy is part of */
    long long worker_starts;/* the workers' starts on jobs (each job's width - 1): what worker_wake is the sum over */
} dsv4_pool_stats;
/* Counting on (the totals restart at zero) or off. Off costs nothing; on, two clock reads a share. Not while a job
 * runs. */
void dsv4_pool_count(dsv4_pool *p, int on);
void dsv4_pool_stats_get(const dsv4_pool *p, dsv4_pool_stats *out);
#endif
