/* Sequence-state loading (state/persist.c: dsv4_seq_load_mem, dsv4_seq_restore_mem) on the tiny model.
 * Fixture (built once): the tiny model in each KV storage format, each with a reference state of 6 tokens to
 * restore over.
 * What must hold for any input:
 *   - load either fails with a one-line error or gives a sequence that re-saves to the same bytes (the format
 *     is canonical; only ring_len, which the header calls informational, the format version and writer field
 *     (a version 1 file re-saves as the current version) and so the checksum may differ) and
 *     that can take one more step;
 *   - restore over a live sequence either succeeds the same way or leaves it bit-for-bit unchanged. */
#include "state_target.h"
#include "../fuzz.h"
#include "state/persist.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define RING_LEN_AT 44   /* byte offset of the header's u32 ring_len (persist.h) */

#define KV_WORD_AT 24     /* byte offset of the header's u32 KV storage word; its low byte is the format */

/* One model per KV storage format (f32, bf16, fp8: state/kvrows.h), each with its reference state: an input is
 * loaded into the model whose format its header names, so the row layouts of all three are fuzzed. */
static dsv4_model *models[3];
static void *refs[3];
static size_t ref_lens[3];

static void free_fixture(void) {
    for (int f = 0; f < 3; f++) {
        free(refs[f]);
        dsv4_model_free(models[f]);
    }
}

void fuzz_state_init(void) {
    char dir[4300];
    dsv4_error err;
    snprintf(dir, sizeof dir, "%s/ck", fuzz_tmpdir());
    if (fuzz_tiny_write(dir, 1, &err)) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
    for (int f = 0; f < 3; f++) {
        models[f] = fuzz_tiny_model(dir, f);
        fuzz_tiny_state(models[f], 6, &refs[f], &ref_lens[f]);
    }
    atexit(free_fixture);
}

/* A state file without what may legitimately differ after load + save: the format version word (a version 1
 * file re-saves as the current version), ring_len, the writer field of version >= 2 (which build wrote it) and
 * the checksum. Only called on buffers that loaded, so the header's n_layers is sane. Malloc'd; NULL: too short. */
#define VERSION_AT 8
#define N_LAYERS_AT 28
#define RATIOS_AT 56      /* the ratio table, then (version >= 2) the writer field */
static uint8_t *canonical(const uint8_t *p, size_t n, size_t *out) {
    if (n < RATIOS_AT + 8) return NULL;
    uint32_t version, n_layers;
    memcpy(&version, p + VERSION_AT, 4);
    memcpy(&n_layers, p + N_LAYERS_AT, 4);
    const size_t wr = RATIOS_AT + n_layers, wlen = version >= 2 ? PERSIST_WRITER_BYTES : 0;
    if (n < wr + wlen + 8) return NULL;
    uint8_t *c = malloc(n);
    if (!c) return NULL;
    memcpy(c, p, wr);
    memset(c + VERSION_AT, 0, 4);
    memset(c + RING_LEN_AT, 0, 4);
    memcpy(c + wr, p + wr + wlen, n - 8 - wr - wlen);
    *out = n - 8 - wlen;
    return c;
}

/* Equal as state files, ignoring what canonical() drops. */
static int same_state(const void *a, size_t na, const void *b, size_t nb) {
    size_t ca_n = 0, cb_n = 0;
    uint8_t *ca = canonical(a, na, &ca_n), *cb = canonical(b, nb, &cb_n);
    const int same = ca && cb && ca_n == cb_n && !memcmp(ca, cb, ca_n);
    free(ca);
    free(cb);
    return same;
}

static void check_saves_as(const dsv4_seq *s, const void *buf, size_t len) {
    void *again;
    size_t n;
    dsv4_error err;
    FUZZ_CHECK(dsv4_seq_save_mem(s, &again, &n, &err) == 0, "a loaded state cannot be saved: %s", err.msg);
    FUZZ_CHECK(same_state(again, n, buf, len), "a loaded state re-saves differently (%zu vs %zu bytes)", n, len);
    free(again);
}

static void check_steps(dsv4_model *model, dsv4_seq *s) {
    const int32_t tok = (int32_t)((dsv4_seq_position(s) * 7 + 3) % 64);
    dsv4_step_item it = { .seq = s, .tokens = &tok, .n_tokens = 1, .want = DSV4_LOGITS_NONE };
    dsv4_error err;
    int rc = dsv4_step(model, &it, 1, &err);
    if (rc) fuzz_check_error(rc, &err);   /* the context limit, say */
}

void fuzz_state_one(const uint8_t *data, size_t size, int fix_checksum) {
    uint8_t *buf = malloc(size ? size : 1);   /* exact size, so ASan sees any read past the end */
    if (!buf) return;
    if (size) memcpy(buf, data, size);
    if (fix_checksum && size >= 8) {
        uint64_t h = XXH64(buf, size - 8, 0);
        memcpy(buf + size - 8, &h, 8);
    }
    const int f = size > KV_WORD_AT ? buf[KV_WORD_AT] % 3 : 0;
    dsv4_model *model = models[f];
    dsv4_seq *s;
    dsv4_error err = {0};
    int rc = dsv4_seq_load_mem(model, buf, size, &s, &err);
    if (rc) fuzz_check_error(rc, &err);
    else {
        check_saves_as(s, buf, size);
        check_steps(model, s);
        dsv4_seq_free(s);
    }

    dsv4_seq *live;
    FUZZ_CHECK(dsv4_seq_load_mem(model, refs[f], ref_lens[f], &live, &err) == 0, "reference state: %s", err.msg);
    rc = dsv4_seq_restore_mem(live, buf, size, &err);
    if (rc) {
        fuzz_check_error(rc, &err);
        check_saves_as(live, refs[f], ref_lens[f]);   /* a failed restore changes nothing */
    } else {
        check_saves_as(live, buf, size);
    }
    dsv4_seq_free(live);
    free(buf);
}
