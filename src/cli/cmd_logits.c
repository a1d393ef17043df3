/* dsv4 logits: per-position logits as float32 .npy (DESIGN §7). */
#include "cli/cli.h"
#include "state/kvrows.h"
#include "util/fileio.h"
#include "util/npy.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *CMD = "logits";

typedef struct {
    const char *model_dir, *tokens, *batch, *chunks, *out, *state, *resume, *kv;
    dsv4_mode mode;
    int device;                 /* --device cpu|cuda */
    int gpus;                    /* --gpus N (0 = 1) */
    cli_placement place;   /* --gpu-mem, --expert-profile */
    int kv_format;       /* dsv4_kv_format, from --kv */
    long long save_at, threads;
} logits_opts;

static int parse_args(int argc, char **argv, logits_opts *o) {
    memset(o, 0, sizeof *o);
    o->save_at = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
#define VAL() do { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model_dir = v; }
        else if (!strcmp(a, "--tokens")) { VAL(); o->tokens = v; }
        else if (!strcmp(a, "--batch")) { VAL(); o->batch = v; }
        else if (!strcmp(a, "--chunks")) { VAL(); o->chunks = v; }
        else if (!strcmp(a, "--out")) { VAL(); o->out = v; }
        else if (!strcmp(a, "--state")) { VAL(); o->state = v; }
        else if (!strcmp(a, "--resume")) { VAL(); o->resume = v; }
        else if (!strcmp(a, "--kv")) { VAL(); o->kv = v; }
        else if (!strcmp(a, "--save-at")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1LL << 40, &o->save_at)) return 1; }
        else if (!strcmp(a, "--threads")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1024, &o->threads)) return 1; }
        else if (!strcmp(a, "--mode")) { VAL(); if (cli_parse_mode(CMD, v, &o->mode)) return 1; }
        else if (!strcmp(a, "--device")) { VAL(); if (cli_parse_device(CMD, v, &o->device)) return 1; }
        else if (!strcmp(a, "--gpus")) { VAL(); if (cli_parse_gpus(CMD, v, &o->gpus)) return 1; }
        else if ((r = cli_placement_option(CMD, argc, argv, &i, &o->place)) != 0) { if (r < 0) return 1; }
        else if (cli_amx_option(a, &o->place)) continue;
        else return cli_error(CMD, "unknown option '%s'", a);
#undef VAL
    }
    if (!o->model_dir) return cli_error(CMD, "missing -m DIR");
    if (!o->tokens == !o->batch) return cli_error(CMD, "give exactly one of --tokens and --batch");
    if (o->kv && (o->kv_format = kv_format_parse(o->kv)) < 0)
        return cli_error(CMD, "--kv must be f32, bf16 or fp8, got '%s'", o->kv);
    if ((o->save_at >= 0) != (o->state != NULL))
        return cli_error(CMD, "--save-at K and --state FILE go together (process K tokens, save the state to FILE, stop)");
    if (o->batch && (o->state || o->resume))
        return cli_error(CMD, "--save-at/--state/--resume work with --tokens, not --batch");
    return 0;
}

/* Feed `tokens` to `seq` as calls of the given chunk sizes (then one token per call), or in one call when
 * there are no chunk sizes. Every position's logits land in `logits`. */
static int run_chunked(dsv4_model *m, dsv4_seq *seq, const int32_t *tok, int n, const int32_t *chunks, int n_chunks,
                       float *logits, int vocab) {
    dsv4_error err;
    int done = 0, ci = 0;
    while (done < n) {
        int len = !chunks ? n : ci < n_chunks ? chunks[ci++] : 1;
        if (len > n - done) len = n - done;
        dsv4_step_item it = { seq, tok + done, len, DSV4_LOGITS_ALL, logits + (int64_t)done * vocab };
        if (dsv4_step(m, &it, 1, &err)) return cli_fail(CMD, &err);
        done += len;
    }
    return 0;
}

/* The sequence to start from: fresh, or restored from --resume (whose tokens must be a prefix of ours). */
static int start_seq(dsv4_model *m, const logits_opts *o, const int32_t *tok, int n, dsv4_seq **seq) {
    dsv4_error err;
    if (!o->resume) return dsv4_seq_new(m, seq, &err) ? cli_fail(CMD, &err) : 0;
    if (dsv4_seq_load(m, o->resume, seq, &err)) return cli_fail(CMD, &err);
    const int64_t p = dsv4_seq_position(*seq);
    const int32_t *saved = dsv4_seq_tokens(*seq);
    if (p > n) return cli_error(CMD, "--resume %s holds %lld tokens, more than the %d of --tokens", o->resume, (long long)p, n);
    for (int64_t i = 0; i < p; i++)
        if (saved[i] != tok[i])
            return cli_error(CMD, "--resume %s: its token %lld is %d but --tokens has %d there (not a prefix)", o->resume,
                             (long long)i, saved[i], tok[i]);
    return 0;
}

/* Tokens [start, end) are processed: start = the resumed position (or 0), end = --save-at (or all). Logits
 * are written for those positions only. */
static int run_single(dsv4_model *m, const logits_opts *o) {
    int32_t *tok = NULL, *chunks = NULL;
    int n = 0, n_chunks = 0, rc = 1;
    float *logits = NULL;
    dsv4_seq *seq = NULL;
    dsv4_error err;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    if (cli_parse_tokens(CMD, o->tokens, &tok, &n)) goto out;
    if (o->save_at > n) { cli_error(CMD, "--save-at %lld is beyond the %d tokens given", o->save_at, n); goto out; }
    if (start_seq(m, o, tok, n, &seq)) goto out;
    const int start = (int)dsv4_seq_position(seq), end = o->save_at >= 0 ? (int)o->save_at : n;
    if (end < start) { cli_error(CMD, "--save-at %d is before the resumed position %d", end, start); goto out; }
    if (o->chunks) {
        if (cli_parse_tokens(CMD, o->chunks, &chunks, &n_chunks)) goto out;
        int64_t sum = 0;
        for (int i = 0; i < n_chunks; i++) {
            if (chunks[i] <= 0) { cli_error(CMD, "--chunks sizes must be positive"); goto out; }
            sum += chunks[i];
        }
        if (sum > end - start) {
            cli_error(CMD, "--chunks add up to %lld but only %d tokens are processed", (long long)sum, end - start);
            goto out;
        }
    }
    logits = malloc(sizeof(float) * ((size_t)(end - start) * (size_t)info.vocab_size + 1));
    if (!logits) { cli_error(CMD, "out of memory for %d x %d logits", end - start, info.vocab_size); goto out; }
    if (run_chunked(m, seq, tok + start, end - start, o->chunks ? chunks : NULL, n_chunks, logits, info.vocab_size)) goto out;
    if (o->out && npy_write_f32(o->out, logits, end - start, info.vocab_size, &err)) { cli_fail(CMD, &err); goto out; }
    if (o->state && dsv4_seq_save(seq, o->state, &err)) { cli_fail(CMD, &err); goto out; }
    rc = 0;
out:
    dsv4_seq_free(seq);
    free(logits);
    free(tok);
    free(chunks);
    return rc;
}

/* --batch: every line is one stream; all streams run together in the same steps. */
static int run_batch(dsv4_model *m, const logits_opts *o) {
    char *text = NULL;
    dsv4_error err;
    if (dsv4_read_file(o->batch, &text, NULL, &err)) return cli_fail(CMD, &err);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int cap = 16, n = 0, rc = 1;
    int32_t **tok = calloc((size_t)cap, sizeof *tok);
    int *len = calloc((size_t)cap, sizeof *len);
    dsv4_seq **seq = NULL;
    float **logits = NULL;
    dsv4_step_item *items = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!*line || *line == '\r') continue;
        if (n == cap) {
            cap *= 2;
            tok = realloc(tok, sizeof *tok * (size_t)cap);
            len = realloc(len, sizeof *len * (size_t)cap);
            if (!tok || !len) { cli_error(CMD, "out of memory"); goto out; }
        }
        if (cli_parse_tokens(CMD, line, &tok[n], &len[n])) goto out;
        n++;
    }
    if (!n) { cli_error(CMD, "%s: no token lines", o->batch); goto out; }
    seq = calloc((size_t)n, sizeof *seq);
    logits = calloc((size_t)n, sizeof *logits);
    items = calloc((size_t)n, sizeof *items);
    if (!seq || !logits || !items) { cli_error(CMD, "out of memory"); goto out; }
    for (int i = 0; i < n; i++) {
        if (dsv4_seq_new(m, &seq[i], &err)) { cli_fail(CMD, &err); goto out; }
        logits[i] = malloc(sizeof(float) * (size_t)len[i] * (size_t)info.vocab_size);
        if (!logits[i]) { cli_error(CMD, "out of memory"); goto out; }
        items[i] = (dsv4_step_item){ seq[i], tok[i], len[i], DSV4_LOGITS_ALL, logits[i] };
    }
    if (dsv4_step(m, items, n, &err)) { cli_fail(CMD, &err); goto out; }
    if (o->out)
        for (int i = 0; i < n; i++) {
            char path[4200];
            snprintf(path, sizeof path, "%s.%d.npy", o->out, i);
            if (npy_write_f32(path, logits[i], len[i], info.vocab_size, &err)) { cli_fail(CMD, &err); goto out; }
        }
    rc = 0;
out:
    for (int i = 0; i < n; i++) {
        free(tok[i]);
        if (seq) dsv4_seq_free(seq[i]);
        if (logits) free(logits[i]);
    }
    free(tok); free(len); free(seq); free(logits); free(items); free(text);
    return rc;
}

int cmd_logits(int argc, char **argv) {
    logits_opts o;
    if (parse_args(argc, argv, &o)) return 1;
    dsv4_load_opts lo = { .mode = o.mode, .kv_format = o.kv_format, .n_threads = (int)o.threads, .quiet = 0,
                          .device = o.device, .n_gpus = o.gpus };
    cli_placement_apply(&o.place, &lo);
    dsv4_model *m;
    dsv4_error err;
    if (dsv4_model_load(o.model_dir, &lo, &m, &err)) return cli_fail(CMD, &err);
    int rc = o.batch ? run_batch(m, &o) : run_single(m, &o);
    dsv4_model_free(m);
    return rc;
}
