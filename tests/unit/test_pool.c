/* The CPU thread pool (backend/cpu/pool.h): dsv4_pool_run and dsv4_pool_run_blocks hand every item of [0, n) to
 * exactly one call, whatever n, the block size and the thread count; a block call covers one whole block (the last
 * one shorter) at a block boundary; with one thread, or a job of one block, the caller runs [0, n) in one call; the
 * counters count the jobs while counting is on and only then; and any spin setting keeps all of that, as does any
 * width (only threads below it take part; the others sleep and come back when it grows). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include "backend/cpu/pool.h"

typedef struct {
    int n, block;
    atomic_int *seen;      /* [n]: how many calls covered item i */
    atomic_int bad;        /* a call's range broke the rules */
    atomic_int calls;
    int max_thread;        /* the pool's width - 1 */
} cover_job;

static void cover(void *ctx, int begin, int end, int thread) {
    cover_job *j = ctx;
    atomic_fetch_add(&j->calls, 1);
    if (begin < 0 || end > j->n || begin >= end || thread < 0 || thread > j->max_thread) atomic_store(&j->bad, 1);
    if (j->block > 0 && (begin % j->block || (end - begin != j->block && end != j->n))) atomic_store(&j->bad, 1);
    for (int i = begin; i < end && i >= 0 && i < j->n; i++) atomic_fetch_add(&j->seen[i], 1);
}

/* block 0: dsv4_pool_run */
static void check_cover(dsv4_pool *p, int n, int block) {
    const int alone = dsv4_pool_width(p) == 1 || (block && n <= block);   /* the caller runs [0, n) in one call */
    cover_job j = { .n = n, .block = alone ? 0 : block, .max_thread = dsv4_pool_width(p) - 1 };
    j.seen = calloc((size_t)n, sizeof *j.seen);
    assert_non_null(j.seen);
    atomic_init(&j.bad, 0);
    atomic_init(&j.calls, 0);
    if (block) dsv4_pool_run_blocks(p, n, block, cover, &j);
    else dsv4_pool_run(p, n, cover, &j);
    for (int i = 0; i < n; i++)
        if (atomic_load(&j.seen[i]) != 1) fail_msg("n %d block %d threads %d: item %d covered %d times", n, block,
                                                  dsv4_pool_threads(p), i, atomic_load(&j.seen[i]));
    assert_int_equal(atomic_load(&j.bad), 0);
    if (block) assert_int_equal(atomic_load(&j.calls), alone ? 1 : (n + block - 1) / block);
    free(j.seen);
}

static void every_item_once(void **state) {
    (void)state;
    const int threads[] = {1, 2, 3, 7}, ns[] = {1, 2, 5, 63, 64, 65, 1000, 4099}, blocks[] = {0, 1, 3, 16, 64, 5000};
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        dsv4_pool *p = dsv4_pool_new(threads[t]);
        assert_non_null(p);
        assert_int_equal(dsv4_pool_threads(p), threads[t]);
        for (int rep = 0; rep < 20; rep++)   /* repeated: the runs' order differs from job to job */
            for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
                for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) check_cover(p, ns[a], blocks[b]);
        dsv4_pool_free(p);
    }
}

static void caller_alone(void *ctx, int begin, int end, int thread) {
    (void)begin, (void)end;
    if (thread != 0) atomic_store((atomic_int *)ctx, 1);
}

static void noop(void *ctx, int begin, int end, int thread) { (void)ctx, (void)begin, (void)end, (void)thread; }

static void counters(void **state) {
    (void)state;
    dsv4_pool *p = dsv4_pool_new(3);
    assert_non_null(p);
    atomic_int other = 0;
    dsv4_pool_run_blocks(p, 10, 10, caller_alone, &other);   /* one block: no worker takes part */
    dsv4_pool_run(p, 1, caller_alone, &other);
    assert_int_equal(atomic_load(&other), 0);
    dsv4_pool_stats s;
    dsv4_pool_run(p, 100, noop, NULL);   /* not counted: counting is off */
    dsv4_pool_count(p, 1);
    dsv4_pool_stats_get(p, &s);
    assert_int_equal(s.jobs, 0);
    dsv4_pool_run(p, 100, noop, NULL);
    dsv4_pool_run_blocks(p, 100, 7, noop, NULL);
    dsv4_pool_run(p, 1, noop, NULL);   /* inline: a job, not a shared one */
    dsv4_pool_stats_get(p, &s);
    assert_int_equal(s.jobs, 3);
    assert_int_equal(s.shared, 2);
    assert_true(s.in_run >= s.caller_wait && s.caller_wait >= 0 && s.worker_busy >= 0 && s.worker_wake >= 0);
    /* two shared jobs, two workers each: every worker's time in a job lies within the job's */
    assert_int_equal(s.worker_starts, 4);
    assert_true(s.worker_span >= s.worker_busy && s.worker_span <= 2 * s.in_run);
    dsv4_pool_set_width(p, 2);   /* one worker from here: the spans count one */
    dsv4_pool_run(p, 100, noop, NULL);
    dsv4_pool_stats_get(p, &s);
    assert_int_equal(s.worker_starts, 5);
    dsv4_pool_set_width(p, 3);
    dsv4_pool_count(p, 0);
    dsv4_pool_run(p, 100, noop, NULL);
    dsv4_pool_stats_get(p, &s);
    assert_int_equal(s.jobs, 4);
    dsv4_pool_free(p);
}

/* dsv4_pool_set_spin: with no spin the workers sleep after every job, so every job takes the condition variable's
 * wake-up path (a lost wake-up would hang here); with a long one they spin across pauses between jobs. Either way
 * every item is covered once, and a negative spin counts as none. */
static void spin_settings(void **state) {
    (void)state;
    const int spins[] = {0, -5, 5000};
    for (size_t k = 0; k < sizeof spins / sizeof *spins; k++) {
        dsv4_pool *p = dsv4_pool_new(4);
        assert_non_null(p);
        dsv4_pool_set_spin(p, spins[k]);
        for (int rep = 0; rep < 40; rep++) {
            if (rep % 4 == 0) {
                const struct timespec pause = { 0, 300000 };   /* 0.3 ms: past no spin, within 5 ms */
                nanosleep(&pause, NULL);
            }
            check_cover(p, 1000, rep % 2 ? 16 : 0);
        }
        dsv4_pool_free(p);
    }
}

/* dsv4_pool_set_width, narrowing and widening between jobs (clamped to 1 .. the threads), with workers asleep (no
 * spin) and spinning: each job covers every item once on threads below the width only (cover's max_thread), and a
 * worker left out comes back when the width grows (else the jobs after it would miss its share or hang). */
static void width_settings(void **state) {
    (void)state;
    const int spins[] = {0, 5000}, widths[] = {5, 3, 1, 4, 2, 5, 0, 9, 2, 5};
    for (size_t k = 0; k < sizeof spins / sizeof *spins; k++) {
        dsv4_pool *p = dsv4_pool_new(5);
        assert_non_null(p);
        dsv4_pool_set_spin(p, spins[k]);
        for (int rep = 0; rep < 8; rep++)
            for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
                dsv4_pool_set_width(p, widths[w]);
                const int want = widths[w] < 1 ? 1 : widths[w] > 5 ? 5 : widths[w];
                assert_int_equal(dsv4_pool_width(p), want);
                for (int i = 0; i < 4; i++) check_cover(p, 1000, i % 2 ? 16 : 0);
            }
        dsv4_pool_free(p);   /* with workers outside the width asleep: they must stop too */
        p = dsv4_pool_new(5);
        assert_non_null(p);
        dsv4_pool_set_width(p, 2);
        check_cover(p, 100, 0);
        dsv4_pool_free(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_item_once),
        cmocka_unit_test(counters),
        cmocka_unit_test(spin_settings),
        cmocka_unit_test(width_settings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
