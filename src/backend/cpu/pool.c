#include "backend/cpu/pool.h"
#include "backend/cpu/isa.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#else
static inline void cpu_relax(void) {}
#endif

/* Decode issues dozens of small parallel loops per layer, tens of microseconds apart: waking sleeping
 * threads through a condition variable for each would cost more than the loops. Workers therefore spin on the
 * job counter for a while (measured in time: a pause is 10 cycles on one CPU and 140 on another) and only then
 * sleep; the caller wakes sleepers only when there are any. */
#define SPIN_ROUNDS 512           /* the caller's pauses before it yields its core to the workers it waits for */
/* The default, 200 us: on the 16-thread lent machine (flash-2g decode at 8 threads, hosts' experts of Flash at 16)
 * 30 us let workers fall asleep between a step's loops and 1000 us took cores from the threads with work (runs
 * 62-63). dsv4_pool_set_spin sets another (a GPU model's host experts: their loops come a GPU stretch apart). */
#define SPIN_US 200

struct dsv4_pool {
    int n_threads;
    const cpu_kernels *kern;  /* the linears' instruction set (isa.h) */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    /* the current job: written by the caller before `generation` is bumped, read by workers after */
    dsv4_range_fn fn;
    void *ctx;
    int n;
    int block;                /* 0: static shares; else blocks of this many items (run_blocks) */
    /* run_blocks: thread t owns a contiguous run of blocks, own[t].next .. own[t].end - 1, and takes them in order;
     * then it takes the blocks left in the others' runs (from their fronts), thread t+1's first */
    struct block_run { atomic_int next; int end; char pad[56]; } *own;   /* [n_threads] */
    /* the current job's word: its generation (bumped per job) above JOB_WIDTH_BITS, the threads taking part (0 .. width
     * - 1) below: a worker runs each generation once, if its id is below the width in the same word */
    atomic_ulong generation;
    atomic_int width;         /* the width of the jobs from the next one (dsv4_pool_set_width) */
    pthread_cond_t width_cv;  /* workers outside the width sleep on it until the width grows */
    atomic_int pending;       /* workers still running the current job */
    atomic_int sleepers;      /* workers blocked on work_cv */
    atomic_int stop;
    atomic_int spin_us;       /* an idle worker's spin before it sleeps (dsv4_pool_set_spin) */
    /* dsv4_pool_count: each worker adds to its own slot (no sharing of cache lines while jobs run) */
    int counting;
    double job_start;         /* the current job's start (counting) */
    dsv4_pool_stats caller;
    struct worker_time { double busy, wake; char pad[48]; } *wt;   /* [n_threads] */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct { dsv4_pool *p; int id; } worker_arg;

#define JOB_WIDTH_BITS 16   /* n_threads <= 256 */
static int job_width(unsigned long word) { return (int)(word & ((1ul << JOB_WIDTH_BITS) - 1)); }

/* Thread id's share of the current job, which `width` threads share. */
static void run_share(dsv4_pool *p, int id, int width) {
    if (p->block > 0) {
        for (int k = 0; k < width; k++) {
            struct block_run *r = &p->own[(id + k) % width];
            for (int b; (b = atomic_fetch_add(&r->next, 1)) < r->end;) {
                const int begin = b * p->block;
                p->fn(p->ctx, begin, p->n - begin < p->block ? p->n : begin + p->block, id);
            }
        }
        return;
    }
    int per = p->n / width, extra = p->n % width;
    int begin = id * per + (id < extra ? id : extra);
    int end = begin + per + (id < extra ? 1 : 0);
    if (begin < end) p->fn(p->ctx, begin, end, id);
}

/* Worker id, outside the pool's width: sleep until the width takes it in again (or stop). */
static void wait_for_width(dsv4_pool *p, int id) {
    if (atomic_load(&p->width) > id) return;
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->width) <= id && !atomic_load(&p->stop)) pthread_cond_wait(&p->width_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* Wait for a job word other than `seen` (or stop); returns it. */
static unsigned long wait_for_job(dsv4_pool *p, unsigned long seen, int id) {
    wait_for_width(p, id);
    const double until = now_s() + 1e-6 * atomic_load_explicit(&p->spin_us, memory_order_relaxed);
    for (int spin = 1;; spin++) {
        unsigned long g = atomic_load(&p->generation);
        if (g != seen || atomic_load(&p->stop)) return g;
        cpu_relax();
        if (spin % 64 == 0 && now_s() > until) break;
    }
    pthread_mutex_lock(&p->mu);
    /* sleepers is raised before the re-check: the caller bumps generation before reading sleepers, so one
     * of the two always sees the other (both sequentially consistent) and no wake-up is lost */
    atomic_fetch_add(&p->sleepers, 1);
    unsigned long g;
    while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->work_cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker(void *arg) {
    worker_arg *wa = arg;
    dsv4_pool *p = wa->p;
    int id = wa->id;
    free(wa);
    unsigned long seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen, id);
        if (atomic_load(&p->stop)) break;
        /* a job of fewer threads than this one's id: not counted in its pending, so nothing of it may be touched (the
         * next job may have begun); the next wait sleeps until the width grows */
        const int width = job_width(seen);
        if (id >= width) continue;
        if (p->counting) {
            const double t0 = now_s();
            run_share(p, id, width);
            const double t1 = now_s();
            p->wt[id].wake += t0 - p->job_start;
            p->wt[id].busy += t1 - t0;
        } else {
            run_share(p, id, width);
        }
        atomic_fetch_sub(&p->pending, 1);
    }
    return NULL;
}

dsv4_pool *dsv4_pool_new(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 256) n_threads = 256;
    dsv4_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    p->kern = cpu_kernels_best();
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->width_cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->spin_us, SPIN_US);
    atomic_init(&p->width, n_threads);   /* before the workers start: they read it first */
    /* thread 0 is the caller; workers are 1..n-1 */
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    p->wt = calloc((size_t)n_threads, sizeof *p->wt);
    p->own = calloc((size_t)n_threads, sizeof *p->own);
    if (!p->threads || !p->wt || !p->own) { free(p->threads); free(p->wt); free(p->own); free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n_threads = i; break; }
        wa->p = p;
        wa->id = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa)) { free(wa); p->n_threads = i; break; }
    }
    atomic_store(&p->width, p->n_threads);   /* (fewer if a thread could not start) */
    return p;
}

void dsv4_pool_free(dsv4_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->work_cv);
    pthread_cond_broadcast(&p->width_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->width_cv);
    free(p->threads);
    free(p->wt);
    free(p->own);
    free(p);
}

int dsv4_pool_threads(const dsv4_pool *p) { return p->n_threads; }

int dsv4_pool_width(const dsv4_pool *p) { return atomic_load(&p->width); }

void dsv4_pool_set_width(dsv4_pool *p, int width) {
    if (width < 1) width = 1;
    if (width > p->n_threads) width = p->n_threads;
    const int was = atomic_exchange(&p->width, width);
    if (width <= was) return;   /* those now outside it see so in their next job's word */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->width_cv);
    pthread_mutex_unlock(&p->mu);
}

const cpu_kernels *dsv4_pool_kernels(const dsv4_pool *p) { return p->kern; }

void dsv4_pool_set_kernels(dsv4_pool *p, const cpu_kernels *k) { p->kern = k; }

void dsv4_pool_set_spin(dsv4_pool *p, int us) { atomic_store(&p->spin_us, us > 0 ? us : 0); }

void dsv4_pool_count(dsv4_pool *p, int on) {
    p->counting = on;
    if (!on) return;
    memset(&p->caller, 0, sizeof p->caller);
    for (int i = 0; i < p->n_threads; i++) p->wt[i].busy = p->wt[i].wake = 0;
}

void dsv4_pool_stats_get(const dsv4_pool *p, dsv4_pool_stats *out) {
    *out = p->caller;
    for (int i = 1; i < p->n_threads; i++) {
        out->worker_busy += p->wt[i].busy;
        out->worker_wake += p->wt[i].wake;
    }
}

static int run_job(dsv4_pool *p, int n, int block, dsv4_range_fn fn, void *ctx);

static void run_counted(dsv4_pool *p, int n, int block, dsv4_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!p->counting) { run_job(p, n, block, fn, ctx); return; }
    const double t0 = now_s();
    p->job_start = t0;
    const int workers = run_job(p, n, block, fn, ctx);
    const double t = now_s() - t0;
    p->caller.in_run += t;
    p->caller.jobs++;
    if (workers) {
        p->caller.shared++;
        p->caller.worker_span += workers * t;
        p->caller.worker_starts += workers;
    }
}

void dsv4_pool_run(dsv4_pool *p, int n, dsv4_range_fn fn, void *ctx) { run_counted(p, n, 0, fn, ctx); }

void dsv4_pool_run_blocks(dsv4_pool *p, int n, int block, dsv4_range_fn fn, void *ctx) {
    run_counted(p, n, block > 0 ? block : 1, fn, ctx);
}

/* The job on the caller and the workers of the width; returns how many workers took part (0: the caller ran it alone). */
static int run_job(dsv4_pool *p, int n, int block, dsv4_range_fn fn, void *ctx) {
    const int width = atomic_load(&p->width);
    if (width == 1 || n == 1 || (block && n <= block)) {
        fn(ctx, 0, n, 0);
        return 0;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->block = block;
    if (block) {
        const int blocks = (n + block - 1) / block;
        for (int t = 0; t < width; t++) {
            atomic_store_explicit(&p->own[t].next, (int)((int64_t)blocks * t / width), memory_order_relaxed);
            p->own[t].end = (int)((int64_t)blocks * (t + 1) / width);
        }
    }
    atomic_store(&p->pending, width - 1);
    /* the next generation with this job's width (the counter above the width's bits wraps harmlessly) */
    const unsigned long g = (atomic_load(&p->generation) >> JOB_WIDTH_BITS) + 1;
    atomic_store(&p->generation, g << JOB_WIDTH_BITS | (unsigned long)width);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_share(p, 0, width);
    const double t_own = p->counting ? now_s() : 0;
    /* the others are working (or about to): spin briefly, then yield the core to them */
    for (int spin = 0; atomic_load(&p->pending) > 0; spin++) {
        if (spin < SPIN_ROUNDS) cpu_relax();
        else sched_yield();
    }
    if (p->counting) p->caller.caller_wait += now_s() - t_own;
    return width - 1;
}
