/* Where the weights live (model/safetensors.h st_memory, util/bigmem.h): a CPU model reads its checkpoint from the
 * file mapping, the populated file mapping, or a copy on huge pages (DSV4_WEIGHT_MEMORY). The three must be the
 * same bytes: identical logits in both numeric modes, prefill and decode. A bad DSV4_WEIGHT_MEMORY is an argument
 * error; a file that shrinks between open and copy is an I/O error that leaves the other shards' tensors valid;
 * bigmem hands out 2 MiB aligned memory and bigmem_pread reads every piece of a file (several threads, pieces of
 * 64 MiB) or says the file ended. */
#define _DEFAULT_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "helpers/testmodel.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/tiny.h"
#include "util/bigmem.h"

#define N 20   /* past the window (8): ring wrap, compressed rows */

static const char *const SETS[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"};

typedef struct {
    char dir[64];
    int32_t tok[N];
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    strcpy(f->dir, "/tmp/dsv4-test-wm-XXXXXX");
    if (!f || !mkdtemp(f->dir)) return -1;
    dsv4_tiny_opts o = { .preset = "flash-tiny", .seed = 31, .sets = SETS, .n_sets = 3, .n_shards = 3 };
    dsv4_error err;
    if (dsv4_tiny_write(f->dir, &o, &err)) { fprintf(stderr, "tiny: %s\n", err.msg); return -1; }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    unsetenv("DSV4_WEIGHT_MEMORY");
    if (f) tm_rmdir(f->dir);
    free(f);
    return 0;
}

/* Logits of N tokens (one prefill of 12, then one token per call) with DSV4_WEIGHT_MEMORY=kind. */
static float *logits_with(const fixture *f, const char *kind, dsv4_mode mode, st_memory want, int *vocab) {
    setenv("DSV4_WEIGHT_MEMORY", kind, 1);
    dsv4_model *m = tm_load(f->dir, mode, DSV4_DEVICE_CPU, DSV4_KV_F32);
    assert_non_null(m);
    assert_int_equal(m->weight_memory, want);
    for (int i = 0; i < m->ckpt.n_shards; i++) assert_int_equal(m->ckpt.shards[i].copied, want == ST_MEM_COPY);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    *vocab = info.vocab_size;
    int32_t tok[N];
    tm_tokens(tok, N, info.vocab_size, 9);
    const int chunks[] = {12};
    float *out = tm_logits(m, tok, N, chunks, 1);
    assert_non_null(out);
    dsv4_model_free(m);
    return out;
}

static void same_logits_every_memory(void **state) {
    const fixture *f = *state;
    const dsv4_mode modes[] = {DSV4_MODE_EXACT, DSV4_MODE_OFFICIAL};
    for (int k = 0; k < 2; k++) {
        int vocab;
        float *map = logits_with(f, "map", modes[k], ST_MEM_MAP, &vocab);
        float *pop = logits_with(f, "populate", modes[k], ST_MEM_POPULATE, &vocab);
        float *copy = logits_with(f, "copy", modes[k], ST_MEM_COPY, &vocab);
        const size_t bytes = sizeof(float) * (size_t)N * (size_t)vocab;
        assert_memory_equal(map, pop, bytes);
        assert_memory_equal(map, copy, bytes);
        free(map), free(pop), free(copy);
    }
}

static void bad_setting_is_an_argument_error(void **state) {
    const fixture *f = *state;
    setenv("DSV4_WEIGHT_MEMORY", "hugepages", 1);
    dsv4_load_opts lo = { .mode = DSV4_MODE_OFFICIAL, .quiet = 1 };
    dsv4_model *m = NULL;
    dsv4_error err = {0};
    assert_int_equal(dsv4_model_load(f->dir, &lo, &m, &err), DSV4_E_ARG);
    assert_null(m);
    assert_non_null(strstr(err.msg, "DSV4_WEIGHT_MEMORY"));
    assert_non_null(strstr(err.msg, "hugepages"));
    st_memory w;
    assert_int_equal(st_memory_choose(1, &w, &err), DSV4_E_ARG);
    unsetenv("DSV4_WEIGHT_MEMORY");
    /* unset: a copy when it fits in three quarters of memory, the mapping when not */
    assert_int_equal(st_memory_choose(1 << 20, &w, &err), 0);
    assert_int_equal(w, ST_MEM_COPY);
    assert_int_equal(st_memory_choose(UINT64_MAX / 2, &w, &err), 0);
    assert_int_equal(w, ST_MEM_MAP);
}

/* The last shard shrinks after open: its copy fails with an I/O error naming the file; the shards before it were
 * copied, and their tensors hold the file's bytes. */
static void shrunk_file_is_an_io_error(void **state) {
    const fixture *f = *state;
    st_archive a;
    dsv4_error err = {0};
    assert_int_equal(st_open_dir(f->dir, &a, &err), 0);
    assert_int_equal(a.n_shards, 3);
    const st_shard *last = &a.shards[2];
    char *keep = malloc(last->len);
    assert_non_null(keep);
    memcpy(keep, last->map, last->len);
    assert_int_equal(truncate(last->path, (off_t)(last->len / 2)), 0);
    assert_int_equal(st_copy_shards(&a, 2, &err), DSV4_E_IO);
    assert_non_null(strstr(err.msg, last->path));
    assert_non_null(strstr(err.msg, "shorter"));
    assert_int_equal(a.shards[0].copied, 1);
    assert_int_equal(a.shards[1].copied, 1);
    assert_int_equal(a.shards[2].copied, 0);
    for (int t = 0, seen = 0; t < a.n_tensors; t++) {
        const st_tensor *x = &a.tensors[t];
        if (x->shard == 2) continue;
        const char *base = a.shards[x->shard].map;
        assert_true((const char *)x->data >= base && (const char *)x->data + x->nbytes <= base + a.shards[x->shard].len);
        if (seen++ < 8) {   /* a few tensors against the file itself */
            char *want = malloc(x->nbytes + 1);
            const int fd = open(a.shards[x->shard].path, O_RDONLY);
            assert_true(fd >= 0);
            assert_int_equal(pread(fd, want, x->nbytes, (off_t)((const char *)x->data - base)), (ssize_t)x->nbytes);
            close(fd);
            assert_memory_equal(want, x->data, x->nbytes);
            free(want);
        }
    }
    /* put the file back before the mapping's pages past the new end are read (they would fault) */
    FILE *out = fopen(last->path, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(keep, 1, last->len, out), last->len);
    fclose(out);
    free(keep);
    st_close(&a);
}

static void bigmem_aligned_and_read(void **state) {
    (void)state;
    assert_null(bigmem_alloc(0));
    for (size_t n = 1; n <= (5u << 20); n += (3u << 20) - 1) {
        unsigned char *p = bigmem_alloc(n);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % (2u << 20), 0);
        assert_int_equal(p[0] | p[n - 1], 0);   /* zero-filled */
        p[0] = 1, p[n - 1] = 2;
        bigmem_free(p, n);
    }
    bigmem_free(NULL, 7);
    /* a sparse 130 MiB + 5 file (three 64 MiB pieces) with marks at the piece edges */
    char path[] = "/tmp/dsv4-test-bigmem-XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    const size_t n = (130u << 20) + 5, marks[] = {0, (64u << 20) - 1, 64u << 20, (128u << 20) + 1, n - 1};
    assert_int_equal(ftruncate(fd, (off_t)n), 0);
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
        const unsigned char b = (unsigned char)(0x41 + i);
        assert_int_equal(pwrite(fd, &b, 1, (off_t)marks[i]), 1);
    }
    const size_t off = 3;   /* not at the file's start */
    for (int threads = 1; threads <= 4; threads += 3) {
        unsigned char *p = bigmem_alloc(n - off);
        assert_non_null(p);
        memset(p, 0xee, n - off);
        assert_int_equal(bigmem_pread(p, fd, off, n - off, threads), 0);
        for (size_t i = 1; i < sizeof marks / sizeof *marks; i++) {
            assert_int_equal(p[marks[i] - off], 0x41 + i);
            p[marks[i] - off] = 0;
        }
        size_t nonzero = 0;
        for (size_t i = 0; i < n - off; i++) nonzero += p[i] != 0;
        assert_int_equal(nonzero, 0);
        /* one byte more than the file has: ENODATA */
        errno = 0;
        assert_int_equal(bigmem_pread(p, fd, off + 1, n - off, threads), -1);
        assert_int_equal(errno, ENODATA);
        bigmem_free(p, n - off);
    }
    close(fd);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bigmem_aligned_and_read),
        cmocka_unit_test_setup_teardown(same_logits_every_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_setting_is_an_argument_error, setup, teardown),
        cmocka_unit_test_setup_teardown(shrunk_file_is_an_io_error, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
