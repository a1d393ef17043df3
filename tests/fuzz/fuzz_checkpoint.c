/* Checkpoint validation against the tensor inventory (model/model.c: dsv4_model_load). Fixture (built once): the
 * config.json and single shard of three tiny checkpoints, read into memory: no speculative head, a V4 MTP head,
 * a DSpark drafter. Each input writes a checkpoint folder (config.json + model.safetensors) in a temp folder,
 * with one part of one fixture replaced. Byte 0 selects:
 *   bit 0 = 0: the rest is the shard's JSON header (the original tensor bytes follow it), so names, dtypes,
 *              shapes and offsets are fuzzed against real data;
 *   bit 0 = 1: the rest is config.json (with the original shard), so the inventory the shard is checked
 *              against is fuzzed;
 *   bits 1-2:  the fixture (0 none, 1 V4 MTP, 2 DSpark, 3 none).
 * A checkpoint that loads must run: one step of two tokens. */
#include "fuzz.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char *config, *shard;
    size_t config_len, shard_len, data_off;   /* data_off: where the shard's tensor bytes begin */
} fixture;

static char dir[4200];      /* the folder each input is written to */
static fixture fx[3];

static void free_fixture(void) {
    for (int k = 0; k < 3; k++) { free(fx[k].config); free(fx[k].shard); }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    for (int k = 0; k < 3; k++) {
        char src[4300], path[4400];
        dsv4_error err;
        snprintf(src, sizeof src, "%s/fixture%d", fuzz_tmpdir(), k);
        if (fuzz_tiny_write_mtp(src, 1, k, &err)) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
        snprintf(path, sizeof path, "%s/config.json", src);
        fx[k].config = fuzz_read_file(path, &fx[k].config_len);
        snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", src);
        fx[k].shard = fuzz_read_file(path, &fx[k].shard_len);
        uint64_t hlen;
        memcpy(&hlen, fx[k].shard, 8);
        fx[k].data_off = 8 + (size_t)hlen;
    }
    snprintf(dir, sizeof dir, "%s/ck", fuzz_tmpdir());
    if (mkdir(dir, 0755)) abort();
    atexit(free_fixture);
    return 0;
}

static void write_in_dir(const char *name, const void *a, size_t na, const void *b, size_t nb, const void *c,
                         size_t nc) {
    char path[4300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *buf = malloc(na + nb + nc + 1);
    if (!buf) abort();
    memcpy(buf, a, na);
    if (nb) memcpy(buf + na, b, nb);
    if (nc) memcpy(buf + na + nb, c, nc);
    fuzz_write_file(path, buf, na + nb + nc);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *rest = data + 1;
    const size_t n = size - 1;
    const fixture *f = &fx[(data[0] >> 1 & 3) % 3];
    if (data[0] & 1) {
        write_in_dir("config.json", rest, n, NULL, 0, NULL, 0);
        write_in_dir("model.safetensors", f->shard, f->shard_len, NULL, 0, NULL, 0);
    } else {
        uint64_t hlen = n;
        write_in_dir("config.json", f->config, f->config_len, NULL, 0, NULL, 0);
        write_in_dir("model.safetensors", &hlen, 8, rest, n, f->shard + f->data_off, f->shard_len - f->data_off);
    }
    dsv4_load_opts o = { .mode = DSV4_MODE_EXACT, .n_threads = 1, .quiet = 1 };
    dsv4_model *m;
    dsv4_error err = {0};
    int rc = dsv4_model_load(dir, &o, &m, &err);
    if (rc) { fuzz_check_error(rc, &err); return 0; }
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    dsv4_seq *s;
    FUZZ_CHECK(dsv4_seq_new(m, &s, &err) == 0, "a loaded model cannot make a sequence: %s", err.msg);
    const int32_t tok[2] = { info.bos_id, (info.eos_id + 1) % info.vocab_size };
    float *logits = malloc(sizeof(float) * (size_t)info.vocab_size);
    dsv4_step_item it = { .seq = s, .tokens = tok, .n_tokens = 2, .want = DSV4_LOGITS_LAST, .logits = logits };
    rc = dsv4_step(m, &it, 1, &err);
    if (rc) fuzz_check_error(rc, &err);   /* e.g. a context limit of one token: an error, not a crash */
    free(logits);
    dsv4_seq_free(s);
    dsv4_model_free(m);
    return 0;
}
