/* Prefix-cache files (state/prefix_disk.c, through dsv4_prefix_cache_lookup and prefix_cache_lookup_with).
 * Fixture (built once): the tiny model, and the same with a V4 MTP head and with a DSpark drafter. Input: one
 * selector byte, then the file.
 *   bit 0: recompute the trailing checksum (as in fuzz_state_sum);
 *   bit 1: the file is a drafter state (a companion, state/prefix_companion.h) rather than a sequence state;
 *   bit 2: with bit 1, DSpark's (else MTP's).
 * A sequence state is written into an empty cache folder under the name the cache gives the state of the first
 * 6 tokens of a fixed 8-token request, then the request is looked up: either it hits with exactly those 6
 * tokens, or it misses, counts the file as rejected and removes it; nothing else. A companion is written beside
 * the good state of those 6 tokens (made by a speculating stream of the scheduler, as the server makes it), then a
 * speculating stream's lookup asks for it: either it hits with 6 tokens and a companion that encodes back to the
 * file's payload and that the drafter loads and drafts from, or it misses cleanly: the companion file removed
 * and counted as rejected, the state file kept and still served to a plain lookup. */
#include "fuzz.h"
#include "engine/drafter_named.h"
#include "model/model.h"
#include "state/prefix_companion.h"
#include "state/prefix_disk.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

static dsv4_model *model, *spec_model[2];
static const char *const spec_kind[2] = { "mtp", "dspark" };
static char cache_dir[4200], file_path[4400], comp_path[2][4400], state_path[2][4400];
static void *spec_state[2];
static size_t spec_state_len[2];
static const int32_t request[8] = { 3, 10, 17, 24, 31, 38, 45, 52 };
enum { STORED = 6 };

static void free_fixture(void) {
    dsv4_model_free(model);
    for (int k = 0; k < 2; k++) {
        dsv4_model_free(spec_model[k]);
        free(spec_state[k]);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    char dir[4300];
    dsv4_error err;
    snprintf(dir, sizeof dir, "%s/ck", fuzz_tmpdir());
    if (fuzz_tiny_write(dir, 1, &err)) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
    model = fuzz_tiny_model(dir, DSV4_KV_F32);
    snprintf(cache_dir, sizeof cache_dir, "%s/prefix", fuzz_tmpdir());
    /* the naming rule of prefix_disk.c: p-<fingerprint>-<tokens>-<XXH64 of the tokens>.dsv4seq */
    prefix_disk_state_path(file_path, sizeof file_path, cache_dir, model->fingerprint, request, STORED);
    for (int k = 0; k < 2; k++) {
        snprintf(dir, sizeof dir, "%s/ck-%s", fuzz_tmpdir(), spec_kind[k]);
        if (fuzz_tiny_write_mtp(dir, 1, k ? 2 : 1, &err)) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
        spec_model[k] = fuzz_tiny_model(dir, DSV4_KV_F32);
        /* the good state of the 6 tokens, kept in memory and written beside every companion input */
        char fill[4300];
        snprintf(fill, sizeof fill, "%s/fill-%s", fuzz_tmpdir(), spec_kind[k]);
        fuzz_spec_cache_fill(spec_model[k], spec_kind[k], request, STORED + 1, fill);
        prefix_disk_state_path(state_path[k], sizeof state_path[k], fill, spec_model[k]->fingerprint, request, STORED);
        spec_state[k] = fuzz_read_file(state_path[k], &spec_state_len[k]);
        fuzz_rmtree(fill);
        prefix_disk_state_path(state_path[k], sizeof state_path[k], cache_dir, spec_model[k]->fingerprint, request, STORED);
        prefix_disk_companion_path(comp_path[k], sizeof comp_path[k], cache_dir, spec_model[k]->fingerprint, request, STORED,
                                   spec_kind[k]);
    }
    atexit(free_fixture);
    return 0;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A companion input: hit with a faithful, usable drafter state, or a clean miss. */
static void companion_input(int k, const uint8_t *buf, size_t n) {
    dsv4_model *m = spec_model[k];
    dsv4_drafter dr;
    dsv4_error err = {0};
    const dsv4_sampling greedy = { .temperature = 0.0f, .top_p = 1.0f, .seed = 1 };
    FUZZ_CHECK(dsv4_drafter_named(spec_kind[k], m, &greedy, &dr, &err) == 0, "drafter: %s", err.msg);
    dsv4_prefix_cache *c;
    FUZZ_CHECK(dsv4_prefix_cache_new(1 << 20, &c, &err) == 0, "cache: %s", err.msg);
    FUZZ_CHECK(dsv4_prefix_cache_set_dir(c, cache_dir, 1 << 20, &err) == 0, "cache dir: %s", err.msg);
    fuzz_write_file(state_path[k], spec_state[k], spec_state_len[k]);
    fuzz_write_file(comp_path[k], buf, n);
    dsv4_seq *s;
    int64_t matched;
    const prefix_companion *pc;
    FUZZ_CHECK(prefix_cache_lookup_with(c, m, request, 8, dr.name, dr.prefix_codec, &s, &matched, &pc, &err) == 0,
               "lookup: %s", err.msg);
    dsv4_prefix_cache_stats st;
    dsv4_prefix_cache_get_stats(c, &st);
    if (matched) {
        FUZZ_CHECK(matched == STORED && pc && dsv4_seq_position(s) == STORED && st.disk_rejected == 0 && exists(comp_path[k]),
                   "hit with the wrong state");
        /* what was accepted is exactly what the file says: it encodes back to the same payload */
        void *payload;
        size_t plen;
        FUZZ_CHECK(pc->codec->encode(pc, &payload, &plen, &err) == 0, "encode: %s", err.msg);
        FUZZ_CHECK(plen + PREFIX_COMPANION_HEADER + 8 == n && !memcmp(payload, buf + PREFIX_COMPANION_HEADER, plen),
                   "the accepted drafter state does not encode back to the file's payload");
        free(payload);
        /* and the drafter takes it and drafts (whatever the floats are) without failing */
        FUZZ_CHECK(dr.prefix_load(dr.ctx, pc, request[STORED], &err) == 0, "prefix_load: %s", err.msg);
        int32_t draft[8];
        int probs_given = 0, conf_given = 0;
        float conf[8];
        const int got = dr.propose(dr.ctx, request, STORED, request[STORED], 1, draft, NULL, &probs_given, conf, &conf_given, &err);
        FUZZ_CHECK(got >= 0 && got <= 1, "propose: %d (%s)", got, err.msg);
        for (int i = 0; i < got; i++) FUZZ_CHECK(draft[i] >= 0 && draft[i] < m->cfg.vocab_size, "draft %d out of range", draft[i]);
    } else {
        FUZZ_CHECK(!pc && dsv4_seq_position(s) == 0, "a miss gave a sequence at %lld", (long long)dsv4_seq_position(s));
        FUZZ_CHECK(st.disk_rejected == 1 && !exists(comp_path[k]) && exists(state_path[k]),
                   "a bad drafter state was not rejected and removed alone");
        dsv4_seq_free(s);
        FUZZ_CHECK(dsv4_prefix_cache_lookup(c, m, request, 8, &s, &matched, &err) == 0 && matched == STORED,
                   "the state beside a rejected drafter state is not served");
    }
    dsv4_seq_free(s);
    dsv4_prefix_cache_free(c);
    dsv4_drafter_free(&dr);
    remove(comp_path[k]);
    remove(state_path[k]);
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
    if (data[0] & 2) {
        companion_input((data[0] >> 2) & 1, buf, n);
        free(buf);
        return 0;
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
