#include "backend/cpu/pool.h"
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct dsv4_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    /* the current job */
    dsv4_range_fn fn;
    void *ctx;
    int n;
    unsigned long generation; /* bumped per job; workers run each generation once */
    int pending;              /* workers still running the current job */
    int stop;
};

typedef struct { dsv4_pool *p; int id; } worker_arg;

static void run_share(dsv4_pool *p, int id) {
    int per = p->n / p->n_threads, extra = p->n % p->n_threads;
    int begin = id * per + (id < extra ? id : extra);
    int end = begin + per + (id < extra ? 1 : 0);
    if (begin < end) p->fn(p->ctx, begin, end, id);
}

static void *worker(void *arg) {
    worker_arg *wa = arg;
    dsv4_pool *p = wa->p;
    int id = wa->id;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_share(p, id);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
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
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    /* thread 0 is the caller; workers are 1..n-1 */
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n_threads = i; break; }
        wa->p = p;
        wa->id = i;
        if (pthread_create(&p->threads[i], NULL, worker, wa)) { free(wa); p->n_threads = i; break; }
    }
    return p;
}

void dsv4_pool_free(dsv4_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

int dsv4_pool_threads(const dsv4_pool *p) { return p->n_threads; }

void dsv4_pool_run(dsv4_pool *p, int n, dsv4_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (p->n_threads == 1 || n == 1) { fn(ctx, 0, n, 0); return; }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
