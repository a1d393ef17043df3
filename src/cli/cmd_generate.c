/* dsv4 generate: prefill a prompt in one step, then decode token by token with a sampler.
 * --batch FILE: every non-empty line is one request, all run through the continuous-batching scheduler. */
#include "cli/cli.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "util/error.h"
#include "util/fileio.h"
#include "text/strbuf.h"
#include "text/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *CMD = "generate";

typedef struct {
    const char *model_dir, *prompt, *tokens, *spec, *batch;
    long long n, threads, draft, max_streams, step_tokens;
    int ids, stats;
    dsv4_mode mode;
    dsv4_sampling sp;
} gen_opts;

static int parse(int argc, char **argv, gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->n = 64;
    o->sp.top_p = 1.0f;
    o->max_streams = 16;
    o->step_tokens = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        double x;
        long long k;
#define VAL() do { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model_dir = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VAL(); o->prompt = v; }
        else if (!strcmp(a, "--tokens")) { VAL(); o->tokens = v; }
        else if (!strcmp(a, "--batch")) { VAL(); o->batch = v; }
        else if (!strcmp(a, "--max-streams")) { VAL(); if (cli_parse_int(CMD, a, v, 1, 1 << 16, &o->max_streams)) return 1; }
        else if (!strcmp(a, "--step-tokens")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1 << 24, &o->step_tokens)) return 1; }
        else if (!strcmp(a, "-n")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1LL << 30, &o->n)) return 1; }
        else if (!strcmp(a, "--temp")) { VAL(); if (cli_parse_float(CMD, a, v, &x)) return 1; o->sp.temperature = (float)x; }
        else if (!strcmp(a, "--top-p")) { VAL(); if (cli_parse_float(CMD, a, v, &x)) return 1; o->sp.top_p = (float)x; }
        else if (!strcmp(a, "--min-p")) { VAL(); if (cli_parse_float(CMD, a, v, &x)) return 1; o->sp.min_p = (float)x; }
        else if (!strcmp(a, "--top-k")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1 << 30, &k)) return 1; o->sp.top_k = (int)k; }
        else if (!strcmp(a, "--seed")) { VAL(); if (cli_parse_int(CMD, a, v, 0, (long long)(~0ULL >> 1), &k)) return 1; o->sp.seed = (uint64_t)k; }
        else if (!strcmp(a, "--threads")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1024, &o->threads)) return 1; }
        else if (!strcmp(a, "--spec")) { VAL(); o->spec = v; }
        else if (!strcmp(a, "--draft")) { VAL(); if (cli_parse_int(CMD, a, v, 1, 64, &o->draft)) return 1; }
        else if (!strcmp(a, "--ids")) o->ids = 1;
        else if (!strcmp(a, "--stats")) o->stats = 1;
        else if (!strcmp(a, "--mode")) {
            VAL();
            if (!strcmp(v, "exact")) o->mode = DSV4_MODE_EXACT;
            else if (!strcmp(v, "official")) o->mode = DSV4_MODE_OFFICIAL;
            else return cli_error(CMD, "--mode must be exact or official, got '%s'", v);
        } else return cli_error(CMD, "unknown option '%s'", a);
#undef VAL
    }
    if (!o->model_dir) return cli_error(CMD, "missing -m DIR");
    if (!!o->prompt + !!o->tokens + !!o->batch != 1) return cli_error(CMD, "give exactly one of -p TEXT, --tokens and --batch");
    if (o->spec && strcmp(o->spec, "none"))
        return cli_error(CMD, "--spec %s: speculative decoding is not built yet (only --spec none)", o->spec);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- --batch: many prompts through the continuous-batching scheduler ---------------------------------- */

/* A line of only digits, commas and blanks is a token list; anything else is text for the tokenizer. */
static int is_token_line(const char *line) {
    for (const char *p = line; *p; p++)
        if (!((*p >= '0' && *p <= '9') || *p == ',' || *p == ' ' || *p == '\t' || *p == '\r')) return 0;
    return 1;
}

typedef struct {
    int32_t **tok;
    int *len;
    int n, cap;
} prompt_list;

static void prompts_free(prompt_list *pl) {
    for (int i = 0; i < pl->n; i++) free(pl->tok[i]);
    free(pl->tok);
    free(pl->len);
}

/* Read FILE: one prompt per non-empty line (numbered from 0 in file order, as `dsv4 logits --batch`). Text
 * lines need the checkpoint's tokenizer (loaded on first use into *tok). */
static int read_prompts(const gen_opts *o, dsv4_tokenizer **tok, prompt_list *pl) {
    dsv4_error err;
    char *text = NULL;
    if (dsv4_read_file(o->batch, &text, NULL, &err)) return cli_fail(CMD, &err);
    int rc = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && !rc; line = strtok_r(NULL, "\n", &save)) {
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r') line[--n] = 0;
        if (!n) continue;
        if (pl->n == pl->cap) {
            pl->cap = pl->cap ? 2 * pl->cap : 16;
            int32_t **nt = realloc(pl->tok, sizeof *nt * (size_t)pl->cap);
            if (nt) pl->tok = nt;
            int *nl = realloc(pl->len, sizeof *nl * (size_t)pl->cap);
            if (nl) pl->len = nl;
            if (!nt || !nl) { rc = cli_error(CMD, "out of memory"); break; }
        }
        int32_t *ids = NULL;
        int len = 0;
        if (is_token_line(line)) {
            if (cli_parse_tokens(CMD, line, &ids, &len)) { rc = 1; break; }
        } else {
            if (!*tok && dsv4_tokenizer_load_dir(o->model_dir, tok, &err)) {
                *tok = NULL;
                rc = cli_error(CMD, "%s line %d is text, which needs a tokenizer: %s", o->batch, pl->n, err.msg);
                break;
            }
            size_t nn = 0;
            if (dsv4_tokenizer_encode(*tok, line, n, 0, &ids, &nn, &err)) { rc = cli_fail(CMD, &err); break; }
            len = (int)nn;
        }
        if (len == 0) { free(ids); rc = cli_error(CMD, "%s: prompt %d has no tokens", o->batch, pl->n); break; }
        pl->tok[pl->n] = ids;
        pl->len[pl->n++] = len;
    }
    if (!rc && pl->n == 0) rc = cli_error(CMD, "%s: no prompts", o->batch);
    free(text);
    return rc;
}

/* Every prompt is a request with the command's sampling options; prompt i gets seed --seed + i, so its output
 * equals `dsv4 generate --tokens <line i> --seed <S+i>`. Prints "<i>: id,id,..." in prompt order. */
static int run_batch(const gen_opts *o) {
    dsv4_error err;
    dsv4_load_opts lo = { .mode = o->mode, .n_threads = (int)o->threads, .quiet = 1 };
    dsv4_model *m = NULL;
    dsv4_tokenizer *tok = NULL;
    dsv4_sched *s = NULL;
    prompt_list pl = {0};
    int64_t *ids = NULL;
    int rc = 1;
    if (dsv4_model_load(o->model_dir, &lo, &m, &err)) { rc = cli_fail(CMD, &err); goto out; }
    if (read_prompts(o, &tok, &pl)) goto out;
    dsv4_sched_opts so = { (int)o->max_streams, (int)o->step_tokens };
    if (dsv4_sched_new(m, &so, &s, &err)) { rc = cli_fail(CMD, &err); goto out; }
    ids = calloc((size_t)pl.n, sizeof *ids);
    if (!ids) { rc = cli_error(CMD, "out of memory"); goto out; }
    for (int i = 0; i < pl.n; i++) {
        dsv4_request r = { pl.tok[i], pl.len[i], o->sp, (int)o->n, 1, NULL, 0 };
        r.sampling.seed = o->sp.seed + (uint64_t)i;
        if (dsv4_sched_add(s, &r, &ids[i], &err)) { dsv4_wrap(&err, "prompt %d", i); rc = cli_fail(CMD, &err); goto out; }
    }
    const double t0 = now_s();
    long long steps = 0, fed = 0;
    while (dsv4_sched_pending(s) > 0) {
        if (dsv4_sched_step(s, &err)) { rc = cli_fail(CMD, &err); goto out; }
        steps++;
        fed += dsv4_sched_last_step_tokens(s);
    }
    const double t1 = now_s();
    long long generated = 0;
    for (int i = 0; i < pl.n; i++) {
        dsv4_req_result r;
        if (dsv4_sched_result(s, ids[i], &r, &err)) { rc = cli_fail(CMD, &err); goto out; }
        printf("%d: ", i);
        for (int k = 0; k < r.n_tokens; k++) printf(k ? ",%d" : "%d", r.tokens[k]);
        printf("\n");
        generated += r.n_tokens;
    }
    if (o->stats)
        fprintf(stderr, "batch: %d prompts, %lld steps, %lld tokens fed, %lld generated in %.3f s (%.1f generated tok/s)\n",
                pl.n, steps, fed, generated, t1 - t0, generated / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    rc = 0;
out:
    free(ids);
    dsv4_sched_free(s);
    prompts_free(&pl);
    if (tok) dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    if (parse(argc, argv, &o)) return 1;
    if (o.batch) return run_batch(&o);
    dsv4_error err;
    dsv4_load_opts lo = { .mode = o.mode, .n_threads = (int)o.threads, .quiet = 1 };
    dsv4_model *m = NULL;
    dsv4_tokenizer *tok = NULL;
    dsv4_seq *seq = NULL;
    dsv4_sampler smp = {0};
    int32_t *prompt = NULL, *out_ids = NULL;
    size_t n_prompt = 0;
    float *logits = NULL;
    int rc = 1;
    dsv4_strbuf text;
    dsv4_sb_init(&text);
    dsv4_detokenizer detok;

    if (dsv4_model_load(o.model_dir, &lo, &m, &err)) { rc = cli_fail(CMD, &err); goto out; }
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    if (o.prompt || !o.ids) {
        /* text needs the checkpoint's tokenizer; --tokens with --ids works without one */
        if (dsv4_tokenizer_load_dir(o.model_dir, &tok, &err)) {
            if (o.prompt) { rc = cli_error(CMD, "-p needs a tokenizer: %s", err.msg); goto out; }
            tok = NULL;
        }
    }
    if (o.prompt) {
        if (dsv4_tokenizer_encode(tok, o.prompt, strlen(o.prompt), 0, &prompt, &n_prompt, &err)) { rc = cli_fail(CMD, &err); goto out; }
        if (n_prompt == 0) { rc = cli_error(CMD, "the prompt encodes to no tokens"); goto out; }
    } else {
        int n;
        if (cli_parse_tokens(CMD, o.tokens, &prompt, &n)) goto out;
        n_prompt = (size_t)n;
    }
    if (dsv4_sampler_init(&smp, &o.sp, info.vocab_size, &err)) { rc = cli_fail(CMD, &err); goto out; }
    if (dsv4_seq_new(m, &seq, &err)) { rc = cli_fail(CMD, &err); goto out; }
    logits = malloc(sizeof(float) * (size_t)info.vocab_size);
    out_ids = malloc(sizeof(int32_t) * (size_t)(o.n + 1));
    if (!logits || !out_ids) { rc = cli_error(CMD, "out of memory"); goto out; }
    if (tok) dsv4_detokenizer_init(&detok, tok);

    double t0 = now_s();
    dsv4_step_item it = { seq, prompt, (int)n_prompt, DSV4_LOGITS_LAST, logits };
    if (dsv4_step(m, &it, 1, &err)) { rc = cli_fail(CMD, &err); goto out; }
    double t1 = now_s();
    long long n_out = 0;
    while (n_out < o.n) {
        int32_t next = dsv4_sample(&smp, logits);
        out_ids[n_out++] = next;
        if (!o.ids && tok) {
            if (dsv4_detokenizer_push(&detok, next, &text, &err)) { rc = cli_fail(CMD, &err); goto out; }
            fwrite(text.data, 1, text.len, stdout);
            fflush(stdout);
            dsv4_sb_clear(&text);
        }
        if (next == info.eos_id || n_out == o.n) break;
        dsv4_step_item d = { seq, &next, 1, DSV4_LOGITS_LAST, logits };
        if (dsv4_step(m, &d, 1, &err)) { rc = cli_fail(CMD, &err); goto out; }
    }
    double t2 = now_s();
    if (o.ids || !tok) {
        for (long long i = 0; i < n_out; i++) printf(i ? ",%d" : "%d", out_ids[i]);
        printf("\n");
    } else {
        dsv4_detokenizer_finish(&detok, &text);
        fwrite(text.data, 1, text.len, stdout);
        printf("\n");
    }
    if (o.stats)
        fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tok/s); decode: %lld tokens in %.3f s (%.2f tok/s)\n",
                n_prompt, t1 - t0, n_prompt / (t1 - t0), n_out, t2 - t1, n_out > 1 ? (n_out - 1) / (t2 - t1) : 0.0);
    rc = 0;
out:
    dsv4_sb_free(&text);
    free(logits);
    free(out_ids);
    free(prompt);
    dsv4_sampler_free(&smp);
    dsv4_seq_free(seq);
    if (tok) dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    return rc;
}
