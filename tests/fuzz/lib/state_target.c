/* Sequence-state loading (state/persist.c: dsv4_seq_load_mem, dsv4_seq_restore_mem) on the tiny model.
 * Fixture (built once): the tiny model in each KV storage format, each with a reference state of 6 tokens to
 * restore over.
 * What must hold for any input:
 *   - load either fails with a one-line error or gives a sequence that re-saves to the same bytes (the format
 *     is canonical; only the version, ring_len and the writer, which the header calls informational, and so
 *     the checksum, may differ) and that can take one more step;
 *   - restore over a live sequence either succeeds the same way or leaves it bit-for-bit unchanged. */
#include "state_target.h"
#include "../fuzz.h"
#include "state/persist.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define N_LAYERS_AT 28   /* byte offsets in the header (state/persist.h): u32 n_layers, */
#define RING_LEN_AT 44   /* u32 ring_len */

#define KV_WORD_AT 24    /* and the u32 KV storage word, whose low byte is the format */

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

/* Equal as state files: `saved` was just written (the current format version), `in` is a file that loaded
 * (version 1 or 2). Compared: every header field but the version, ring_len (informational) and the writer
 * (version 2, names the build), then the whole body; not the checksum, which covers the ignored fields. */
static int same_state(const void *saved, size_t ns, const void *in, size_t ni) {
    const uint8_t *x = saved, *y = in;
    if (ns < PERSIST_FIXED_BYTES || ni < PERSIST_FIXED_BYTES) return 0;
    uint32_t version, n_layers;
    memcpy(&version, y + 8, 4);
    memcpy(&n_layers, y + N_LAYERS_AT, 4);
    const size_t hx = PERSIST_FIXED_BYTES + n_layers + PERSIST_WRITER_BYTES,
                 hy = PERSIST_FIXED_BYTES + n_layers + (version >= 2 ? PERSIST_WRITER_BYTES : 0);
    if (n_layers > 256 || ns < hx + 8 || ni < hy + 8 || ns - hx != ni - hy) return 0;
    return !memcmp(x + 12, y + 12, RING_LEN_AT - 12) &&
           !memcmp(x + RING_LEN_AT + 4, y + RING_LEN_AT + 4, PERSIST_FIXED_BYTES - RING_LEN_AT - 4 + n_layers) &&
           !memcmp(x + hx, y + hy, ni - hy - 8);
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
