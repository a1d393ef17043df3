#include "util/bigmem.h"
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

enum { HUGE = 2u << 20, PIECE = 64u << 20, MAX_THREADS = 16 };

static size_t round_huge(size_t n) { return (n + HUGE - 1) / HUGE * HUGE; }

void *bigmem_alloc(size_t n) {
    if (!n || n > SIZE_MAX - 2 * (size_t)HUGE) return NULL;
    const size_t len = round_huge(n), over = len + HUGE;
    char *raw = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    /* keep [p, p + len) with p on a 2 MiB boundary (a huge page needs one); give back the ends */
    char *p = (char *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + over > p + len) munmap(p + len, (size_t)(raw + over - (p + len)));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE);   /* a request: without THP the buffer is on small pages */
#endif
    return p;
}

void bigmem_free(void *p, size_t n) {
    if (p) munmap(p, round_huge(n));
}

typedef struct {
    char *dst;
    int fd;
    size_t off, n;
    pthread_mutex_t lock;
    size_t next;   /* the next piece's start (under lock) */
    int err;       /* the first failure's errno (under lock) */
} pread_job;

static void *pread_worker(void *arg) {
    pread_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->lock);
        const size_t at = j->next;
        const int stop = j->err || at >= j->n;
        if (!stop) j->next = at + (j->n - at < PIECE ? j->n - at : PIECE);
        const size_t end = j->next;
        pthread_mutex_unlock(&j->lock);
        if (stop) return NULL;
        for (size_t o = at; o < end;) {
            const ssize_t r = pread(j->fd, j->dst + o, end - o, (off_t)(j->off + o));
            if (r > 0) { o += (size_t)r; continue; }
            if (r < 0 && errno == EINTR) continue;
            pthread_mutex_lock(&j->lock);
            if (!j->err) j->err = r < 0 ? errno : ENODATA;
            pthread_mutex_unlock(&j->lock);
            return NULL;
        }
    }
}

int bigmem_pread(void *dst, int fd, size_t off, size_t n, int threads) {
    pread_job j = { .dst = dst, .fd = fd, .off = off, .n = n };
    pthread_mutex_init(&j.lock, NULL);
    pthread_t tid[MAX_THREADS];
    int started = 0;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    for (int i = 1; i < threads && (size_t)i * PIECE < n; i++)   /* the caller is one of the readers */
        if (!pthread_create(&tid[started], NULL, pread_worker, &j)) started++;
    pread_worker(&j);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&j.lock);
    if (j.err) errno = j.err;
    return j.err ? -1 : 0;
}
