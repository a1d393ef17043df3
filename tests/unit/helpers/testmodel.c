#include "testmodel.h"
#include "model/tiny.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dsv4_model *tm_make(const char *preset, const char *const *sets, int n_sets, uint64_t seed, dsv4_mode mode,
                    char *dir_out) {
    return tm_make_on(preset, sets, n_sets, seed, mode, DSV4_DEVICE_CPU, DSV4_KV_F32, dir_out);
}

dsv4_model *tm_load(const char *dir, dsv4_mode mode, int device, int kv) {
    dsv4_load_opts lo = { .mode = mode, .quiet = 1, .device = device, .kv_format = kv };
    dsv4_model *m;
    dsv4_error err;
    if (dsv4_model_load(dir, &lo, &m, &err)) { fprintf(stderr, "load %s: %s\n", dir, err.msg); return NULL; }
    return m;
}

dsv4_model *tm_make_on(const char *preset, const char *const *sets, int n_sets, uint64_t seed, dsv4_mode mode, int device,
                       int kv, char *dir_out) {
    char tmpl[] = "/tmp/dsv4-test-XXXXXX";
    if (!mkdtemp(tmpl)) { perror("mkdtemp"); return NULL; }
    strcpy(dir_out, tmpl);
    dsv4_tiny_opts o = { .preset = preset, .seed = seed, .sets = sets, .n_sets = n_sets };
    dsv4_error err;
    if (dsv4_tiny_write(tmpl, &o, &err)) { fprintf(stderr, "tiny: %s\n", err.msg); return NULL; }
    return tm_load(tmpl, mode, device, kv);
}

void tm_rmdir(const char *dir) {
    char cmd[512];
    if (strncmp(dir, "/tmp/dsv4-", 10)) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
}

float *tm_logits(dsv4_model *m, const int32_t *tokens, int n, const int *chunks, int n_chunks) {
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)info.vocab_size);
    dsv4_seq *s;
    dsv4_error err;
    if (!out || dsv4_seq_new(m, &s, &err)) { free(out); return NULL; }
    int done = 0, ci = 0;
    while (done < n) {
        int len = !chunks ? n : ci < n_chunks ? chunks[ci++] : 1;
        if (len > n - done) len = n - done;
        dsv4_step_item it = { s, tokens + done, len, DSV4_LOGITS_ALL, out + (int64_t)done * info.vocab_size };
        if (dsv4_step(m, &it, 1, &err)) {
            fprintf(stderr, "step: %s\n", err.msg);
            free(out);
            dsv4_seq_free(s);
            return NULL;
        }
        done += len;
    }
    dsv4_seq_free(s);
    return out;
}

void tm_tokens(int32_t *out, int n, int vocab, uint64_t seed) {
    dsv4_rng r;
    dsv4_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) out[i] = (int32_t)dsv4_rng_below(&r, (uint32_t)vocab);
}

char *tm_read(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

int tm_greedy(dsv4_model *m, const int32_t *prompt, int n_prompt, int n_new, int32_t *out) {
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    dsv4_seq *s;
    dsv4_error err;
    if (dsv4_seq_new(m, &s, &err)) return -1;
    float *l = malloc(sizeof(float) * (size_t)info.vocab_size);
    dsv4_step_item it = { s, prompt, n_prompt, DSV4_LOGITS_LAST, l };
    int rc = l ? dsv4_step(m, &it, 1, &err) : -1;
    for (int i = 0; !rc && i < n_new; i++) {
        int best = 0;
        for (int v = 1; v < info.vocab_size; v++) if (l[v] > l[best]) best = v;
        out[i] = best;
        dsv4_step_item d = { s, &out[i], 1, DSV4_LOGITS_LAST, l };
        if (i + 1 < n_new) rc = dsv4_step(m, &d, 1, &err);
    }
    if (rc) fprintf(stderr, "greedy: %s\n", err.msg);
    free(l);
    dsv4_seq_free(s);
    return rc;
}
