/* State files name the build that wrote them (issue 19): format version 2 adds a writer field to the header,
 * and version 1 files (no writer field) still load. A version 1 file is made here the way the version 1 writer
 * laid it out (persist.h: version 2 minus the writer field, with its own checksum); loading it and saving again
 * must give exactly the state a direct save gives, and the continuation must match bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "helpers/testmodel.h"
#include "state/persist.h"
#include "util/version.h"

#define N 140   /* past an HCA row (128) and the window (8) */
#define K 131   /* the saved prefix */

static const char *const SETS[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"};

typedef struct {
    dsv4_model *m;
    char dir[256];
    int vocab;
    int32_t tok[N];
    void *v2;           /* state after K tokens, as this build saves it */
    size_t v2_len;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->m = tm_make("flash-tiny", SETS, 3, 77, DSV4_MODE_EXACT, f->dir);
    if (!f->m) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    tm_tokens(f->tok, N, f->vocab, 5);
    dsv4_seq *s;
    dsv4_error err;
    dsv4_step_item it = {0};
    if (dsv4_seq_new(f->m, &s, &err)) return -1;
    it.seq = s, it.tokens = f->tok, it.n_tokens = K;
    if (dsv4_step(f->m, &it, 1, &err) || dsv4_seq_save_mem(s, &f->v2, &f->v2_len, &err)) return -1;
    dsv4_seq_free(s);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->v2);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

static size_t ratio_end(const void *buf) {
    uint32_t n_layers;
    memcpy(&n_layers, (const uint8_t *)buf + 8 + 4 + 4 + 8 + 4, 4);   /* magic, version, mode, fingerprint, kv */
    return PERSIST_FIXED_BYTES + n_layers;
}

static void reseal(uint8_t *buf, size_t len) {
    uint64_t h = XXH64(buf, len - 8, 0);
    memcpy(buf + len - 8, &h, 8);
}

/* The version 1 layout of the same state: no writer field, version word 1, its own checksum. */
static uint8_t *as_v1(const fixture *f, size_t *len) {
    const size_t cut = ratio_end(f->v2);
    *len = f->v2_len - PERSIST_WRITER_BYTES;
    uint8_t *b = malloc(*len);
    memcpy(b, f->v2, cut);
    memcpy(b + cut, (const uint8_t *)f->v2 + cut + PERSIST_WRITER_BYTES, f->v2_len - cut - PERSIST_WRITER_BYTES);
    const uint32_t one = 1;
    memcpy(b + 8, &one, 4);
    reseal(b, *len);
    return b;
}

static void test_v2_names_its_writer(void **state) {
    fixture *f = *state;
    persist_header h;
    dsv4_error err;
    assert_int_equal(persist_read_header(f->v2, f->v2_len, &h, &err), 0);
    assert_int_equal(h.version, 2);
    assert_string_equal(h.writer, dsv4_build_writer());
    assert_non_null(strstr(h.writer, DSV4_VERSION));
    assert_int_equal(strncmp(h.writer, "dsv4 ", 5), 0);
    /* the field is NUL-padded: the bytes after the text are zero, so equal states save to equal bytes */
    const uint8_t *w = (const uint8_t *)f->v2 + ratio_end(f->v2);
    for (size_t i = strlen(h.writer); i < PERSIST_WRITER_BYTES; i++) assert_int_equal(w[i], 0);
}

static void test_v1_still_loads(void **state) {
    fixture *f = *state;
    size_t len;
    uint8_t *v1 = as_v1(f, &len);
    persist_header h;
    dsv4_error err;
    assert_int_equal(persist_read_header(v1, len, &h, &err), 0);
    assert_int_equal(h.version, 1);
    assert_string_equal(h.writer, "");
    assert_int_equal(h.pos, K);

    dsv4_seq *a = NULL, *b = NULL;
    if (dsv4_seq_load_mem(f->m, v1, len, &a, &err)) fail_msg("v1 load: %s", err.msg);
    /* saved again, it is the version 2 file of the same state, byte for byte */
    void *again;
    size_t again_len;
    assert_int_equal(dsv4_seq_save_mem(a, &again, &again_len, &err), 0);
    assert_int_equal(again_len, f->v2_len);
    assert_memory_equal(again, f->v2, f->v2_len);
    free(again);

    /* and it continues exactly like the state loaded from the version 2 file */
    assert_int_equal(dsv4_seq_load_mem(f->m, f->v2, f->v2_len, &b, &err), 0);
    const size_t V = (size_t)f->vocab;
    float *la = malloc(sizeof(float) * V * (N - K)), *lb = malloc(sizeof(float) * V * (N - K));
    dsv4_step_item it[2] = {{a, f->tok + K, N - K, DSV4_LOGITS_ALL, la}, {b, f->tok + K, N - K, DSV4_LOGITS_ALL, lb}};
    assert_int_equal(dsv4_step(f->m, it, 2, &err), 0);
    assert_memory_equal(la, lb, sizeof(float) * V * (N - K));
    free(la);
    free(lb);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
    free(v1);
}

static void test_bad_versions_and_writers(void **state) {
    fixture *f = *state;
    uint8_t *b = malloc(f->v2_len);
    dsv4_seq *s = NULL;
    dsv4_error err;
    /* a future version: refused, named */
    memcpy(b, f->v2, f->v2_len);
    const uint32_t three = 3;
    memcpy(b + 8, &three, 4);
    reseal(b, f->v2_len);
    assert_int_equal(dsv4_seq_load_mem(f->m, b, f->v2_len, &s, &err), DSV4_E_FORMAT);
    assert_non_null(strstr(err.msg, "version 3"));
    assert_null(s);
    /* a writer field that is not text, or has bytes after its NUL, under a valid checksum: corrupted */
    const size_t w = ratio_end(f->v2);
    for (int c = 0; c < 2; c++) {
        memcpy(b, f->v2, f->v2_len);
        if (c == 0) b[w + 2] = 0x07;
        else b[w + PERSIST_WRITER_BYTES - 1] = 'x';
        reseal(b, f->v2_len);
        assert_int_equal(dsv4_seq_load_mem(f->m, b, f->v2_len, &s, &err), DSV4_E_FORMAT);
        assert_non_null(strstr(err.msg, "writer"));
        assert_null(s);
    }
    /* a v1 file that claims version 2 is read as one whose writer field swallowed real data: caught */
    size_t len;
    uint8_t *v1 = as_v1(f, &len);
    const uint32_t two = 2;
    memcpy(v1 + 8, &two, 4);
    reseal(v1, len);
    assert_int_not_equal(dsv4_seq_load_mem(f->m, v1, len, &s, &err), 0);
    assert_null(s);
    free(v1);
    free(b);
}

static void test_version_api(void **state) {
    (void)state;
    assert_string_equal(dsv4_version(), DSV4_VERSION);
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", DSV4_VERSION_MAJOR, DSV4_VERSION_MINOR, DSV4_VERSION_PATCH);
    assert_string_equal(buf, DSV4_VERSION);
    assert_true(strlen(dsv4_build_writer()) < PERSIST_WRITER_BYTES);
    assert_true(strlen(dsv4_build_commit()) > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v2_names_its_writer),
        cmocka_unit_test(test_v1_still_loads),
        cmocka_unit_test(test_bad_versions_and_writers),
        cmocka_unit_test(test_version_api),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
