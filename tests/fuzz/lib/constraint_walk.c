/* See constraint_walk.h. */
#include "constraint_walk.h"
#include "../fuzz.h"
#include "engine/constraint_pda.h"   /* sig_probe: the shadow state below takes the stored-walk paths */
#include <stdlib.h>
#include <string.h>

static const char *const k_multi[] = {
    "\"", "{\"", "\":", "\",\"", "\"}", "[]", "{}", "true", "false", "null", "0.5", "-1", "e+1", "\\u00", "\\n",
    "  ", "\n ", "abc", "yes", "no", "\xc3\xa9", "\xe2\x82", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "a\0b",
};
#define N_MULTI (sizeof k_multi / sizeof *k_multi)
static const size_t k_multi_len[N_MULTI] = {
    1, 2, 2, 3, 2, 2, 2, 4, 5, 4, 3, 2, 3, 4, 2, 2, 2, 3, 3, 2, 2, 2, 3, 4, 3,
};
#define N_SPECIAL 2
static const char *const k_special[N_SPECIAL] = { "<S>", "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c" };
#define SPECIAL0 (256 + (int32_t)N_MULTI)          /* special tokens a grammar may name with @"..." */
#define N_VOCAB (SPECIAL0 + N_SPECIAL + 2)          /* + the never-allowed id + EOS */
#define N_WORDS ((N_VOCAB + 63) / 64)

static dsv4_cvocab *g_vocab;   /* the fixture */

static void free_vocab(void) { dsv4_cvocab_free(g_vocab); g_vocab = NULL; }

const dsv4_cvocab *fuzz_cvocab(void) {
    if (g_vocab) return g_vocab;
    static char single[256];
    const char *bytes[N_VOCAB];
    size_t lens[N_VOCAB];
    for (int i = 0; i < 256; i++) { single[i] = (char)i; bytes[i] = &single[i]; lens[i] = 1; }
    for (size_t i = 0; i < N_MULTI; i++) { bytes[256 + i] = k_multi[i]; lens[256 + i] = k_multi_len[i]; }
    for (int i = 0; i < N_SPECIAL; i++) { bytes[SPECIAL0 + i] = NULL; lens[SPECIAL0 + i] = 0; }
    bytes[N_VOCAB - 2] = NULL; lens[N_VOCAB - 2] = 0;
    bytes[N_VOCAB - 1] = NULL; lens[N_VOCAB - 1] = 0;
    dsv4_error err = {0};
    if (dsv4_cvocab_new(bytes, lens, N_VOCAB, N_VOCAB - 1, &g_vocab, &err))
        fuzz_die(__FILE__, __LINE__, "vocab", "%s", err.msg);
    for (int i = 0; i < N_SPECIAL; i++)
        if (dsv4_cvocab_add_special(g_vocab, k_special[i], strlen(k_special[i]), SPECIAL0 + i, &err))
            fuzz_die(__FILE__, __LINE__, "vocab", "%s", err.msg);
    atexit(free_vocab);
    return g_vocab;
}

static int bit(const uint64_t *b, int32_t i) { return (int)((b[i / 64] >> (i % 64)) & 1); }

void fuzz_constraint_walk(const dsv4_grammar *g, const uint8_t *data, size_t size, char **out, size_t *out_len,
                          int *complete) {
    const dsv4_cvocab *v = fuzz_cvocab();
    const int32_t eos = dsv4_cvocab_eos(v);
    *out = NULL; *out_len = 0; *complete = 0;
    fuzz_rng rng;
    fuzz_rng_seed(&rng, data, size);
    dsv4_cstate *st = NULL;
    dsv4_error err = {0};
    int rc = dsv4_cstate_new(g, v, FUZZ_WALK_MAX_BYTES, &st, &err);
    if (rc) { fuzz_check_error(rc, &err); return; }
    /* a shadow stream on a matcher whose every context-independent walk goes through the stored walks or the
     * closed forms of counted repetitions (constraint_sig.c, constraint_count.c; the fixture vocabulary is too
     * small for them otherwise, so the main stream mostly walks): the same masks */
    dsv4_cmatcher *shadow_m = NULL;
    dsv4_cstate *shadow = NULL;
    if (!dsv4_cmatcher_new(g, v, &shadow_m, &err)) {
        shadow_m->sig_probe = 0;
        if (dsv4_cstate_new_shared(shadow_m, FUZZ_WALK_MAX_BYTES, &shadow, &err)) shadow = NULL;
    }
    char *buf = malloc(FUZZ_WALK_MAX_BYTES + 1);
    FUZZ_CHECK(buf, "out of memory");
    size_t used = 0;
    uint64_t bits[N_WORDS], again[N_WORDS];
    int32_t allowed[N_VOCAB];
    int ok = 1;
    for (int step = 0; step <= FUZZ_WALK_MAX_BYTES && !dsv4_cstate_finished(st); step++) {
        if ((rc = dsv4_cstate_allowed(st, bits, &err))) { fuzz_check_error(rc, &err); ok = 0; break; }
        const dsv4_cpos pos = dsv4_cstate_get(st);
        FUZZ_CHECK(pos.used == (int64_t)used, "position says %lld bytes, output has %zu", (long long)pos.used, used);
        int n = 0;
        for (int32_t i = 0; i < N_VOCAB; i++) {
            if (!bit(bits, i)) continue;
            allowed[n++] = i;
            if (i == eos) continue;
            size_t len = 1; /* a special token: one byte of the bound */
            FUZZ_CHECK(dsv4_cvocab_bytes(v, i, &len) || (i >= SPECIAL0 && i < SPECIAL0 + N_SPECIAL),
                       "token %d has no bytes but is allowed", i);
            FUZZ_CHECK(used + len <= FUZZ_WALK_MAX_BYTES, "token %d (%zu bytes) allowed at %zu bytes", i, len, used);
        }
        FUZZ_CHECK(n > 0, "nothing allowed after %zu bytes", used);
        if (shadow) {
            if (dsv4_cstate_allowed(shadow, again, &err)) { dsv4_cstate_free(shadow); shadow = NULL; } /* out of memory */
            else FUZZ_CHECK(!memcmp(bits, again, sizeof bits), "the stored-walk paths give another mask after %zu bytes", used);
        }
        /* dsv4_cstate_allows agrees with the mask (on a sample: one call per token costs as much as the mask) */
        for (int k = 0; k < 8; k++) {
            const int32_t i = k == 0 ? eos : (int32_t)(fuzz_rng_next(&rng) % N_VOCAB);
            FUZZ_CHECK(bit(bits, i) == dsv4_cstate_allows(st, i), "token %d: mask %d, allows %d", i, bit(bits, i),
                       !bit(bits, i));
        }
        FUZZ_CHECK(!dsv4_cstate_complete(st) || bit(bits, eos), "complete but EOS not allowed");
        FUZZ_CHECK(!bit(bits, eos) || dsv4_cstate_complete(st) || n == 1,
                   "EOS allowed on an incomplete value with %d tokens allowed", n);
        FUZZ_CHECK(!bit(bits, N_VOCAB - 2), "the token without bytes is allowed");
        /* a refused token changes nothing */
        const int32_t probe = (int32_t)(fuzz_rng_next(&rng) % N_VOCAB);
        if (!bit(bits, probe)) {
            FUZZ_CHECK(dsv4_cstate_advance(st, probe, &err) == DSV4_E_ARG, "refused token %d accepted", probe);
            const dsv4_cpos p2 = dsv4_cstate_get(st);
            FUZZ_CHECK(p2.cfg == pos.cfg && p2.used == pos.used, "a refused token moved the position");
        }
        /* try another allowed token, roll back, and the mask is the same */
        const int32_t trial = allowed[fuzz_rng_next(&rng) % (uint64_t)n];
        if ((rc = dsv4_cstate_advance(st, trial, &err))) {
            FUZZ_CHECK(rc == DSV4_E_NOMEM, "allowed token %d refused: %s", trial, err.msg);
            fuzz_check_error(rc, &err);
            ok = 0;
            break;
        }
        dsv4_cstate_set(st, pos);
        if ((rc = dsv4_cstate_allowed(st, again, &err))) { fuzz_check_error(rc, &err); ok = 0; break; }
        FUZZ_CHECK(!memcmp(bits, again, sizeof bits), "rollback after token %d changed the mask", trial);
        /* the step */
        const int32_t tok = allowed[fuzz_rng_next(&rng) % (uint64_t)n];
        const int was_complete = dsv4_cstate_complete(st);
        if ((rc = dsv4_cstate_advance(st, tok, &err))) {
            FUZZ_CHECK(rc == DSV4_E_NOMEM, "allowed token %d refused: %s", tok, err.msg);
            fuzz_check_error(rc, &err);
            ok = 0;
            break;
        }
        if (shadow && dsv4_cstate_advance(shadow, tok, &err)) { dsv4_cstate_free(shadow); shadow = NULL; }
        if (tok == eos) {
            FUZZ_CHECK(dsv4_cstate_finished(st), "EOS taken but not finished");
            *complete = was_complete;
            break;
        }
        size_t len = 1;
        const char *b = dsv4_cvocab_bytes(v, tok, &len);
        memcpy(buf + used, b ? b : "S", len); /* a special token stands as one ASCII byte in the output */
        used += len;
    }
    if (ok) {
        FUZZ_CHECK(dsv4_cstate_finished(st), "not finished after %zu bytes (budget %d)", used, FUZZ_WALK_MAX_BYTES);
        FUZZ_CHECK(dsv4_cstate_allowed(st, bits, &err) == 0, "mask after EOS failed: %s", err.msg);
        for (int i = 0; i < N_WORDS; i++) FUZZ_CHECK(bits[i] == 0, "something allowed after EOS");
        buf[used] = 0;
        *out = buf;
        *out_len = used;
    } else {
        free(buf);
    }
    dsv4_cstate_free(st);
    dsv4_cstate_free(shadow);
    dsv4_cmatcher_free(shadow_m);
}
