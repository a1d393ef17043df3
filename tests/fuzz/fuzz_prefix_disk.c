/* Prefix-cache files (state/prefix_disk.c, through dsv4_prefix_cache_lookup). Fixture (built once): the tiny
 * model. Each input is written into an empty cache folder under the name the cache gives the state of the first
 * 6 tokens of a fixed 8-token request, then the request is looked up. Input: one byte (bit 0: recompute the
 * checksum, as in fuzz_state_sum), then the file. Either the lookup hits with exactly those 6 tokens, or it
 * misses, counts the file as rejected and removes it; nothing else. */
#include "fuzz.h"
#include "model/model.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

static dsv4_model *model;
static char cache_dir[4200], file_path[4400];
static const int32_t request[8] = { 3, 10, 17, 24, 31, 38, 45, 52 };
enum { STORED = 6 };

static void free_fixture(void) { dsv4_model_free(model); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    char dir[4300];
    dsv4_error err;
    snprintf(dir, sizeof dir, "%s/ck", fuzz_tmpdir());
    if (fuzz_tiny_write(dir, 1, &err)) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
    model = fuzz_tiny_model(dir, DSV4_KV_F32);
    snprintf(cache_dir, sizeof cache_dir, "%s/prefix", fuzz_tmpdir());
    /* the naming rule of prefix_disk.c: p-<fingerprint>-<tokens>-<XXH64 of the tokens>.dsv4seq */
    snprintf(file_path, sizeof file_path, "%s/p-%016" PRIx64 "-%d-%016" PRIx64 ".dsv4seq", cache_dir,
             model->fingerprint, STORED, (uint64_t)XXH64(request, sizeof(int32_t) * STORED, 0));
    atexit(free_fixture);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const size_t n = size - 1;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return 0;
    if (n) memcpy(buf, data + 1, n);
    if ((data[0] & 1) && n >= 8) {
        uint64_t h = XXH64(buf, n - 8, 0);
        memcpy(buf + n - 8, &h, 8);
    }
    dsv4_prefix_cache *c;
    dsv4_error err = {0};
    FUZZ_CHECK(dsv4_prefix_cache_new(1 << 20, &c, &err) == 0, "cache: %s", err.msg);
    FUZZ_CHECK(dsv4_prefix_cache_set_dir(c, cache_dir, 1 << 20, &err) == 0, "cache dir: %s", err.msg);
    fuzz_write_file(file_path, buf, n);
    dsv4_seq *s;
    int64_t matched;
    FUZZ_CHECK(dsv4_prefix_cache_lookup(c, model, request, 8, &s, &matched, &err) == 0, "lookup: %s", err.msg);
    dsv4_prefix_cache_stats st;
    dsv4_prefix_cache_get_stats(c, &st);
    struct stat sb;
    const int file_left = stat(file_path, &sb) == 0;
    if (matched) {
        FUZZ_CHECK(matched == STORED && dsv4_seq_position(s) == STORED &&
                   !memcmp(dsv4_seq_tokens(s), request, sizeof(int32_t) * STORED), "hit with the wrong state");
        FUZZ_CHECK(st.disk_hits == 1 && st.disk_rejected == 0 && file_left, "hit but the file is gone");
    } else {
        FUZZ_CHECK(dsv4_seq_position(s) == 0, "a miss gave a sequence at %lld", (long long)dsv4_seq_position(s));
        FUZZ_CHECK(st.disk_rejected == 1 && !file_left, "a bad file was not rejected and removed");
    }
    dsv4_seq_free(s);
    dsv4_prefix_cache_free(c);
    remove(file_path);
    free(buf);
    return 0;
}
