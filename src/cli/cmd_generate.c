/* dsv4 generate: prefill a prompt in one step, then decode token by token with a sampler.
 * --batch FILE: every non-empty line is one request, all run through the continuous-batching scheduler.
 * --spec ngram|self [--draft N]: speculative decoding (src/engine/speculative.h): every prompt is a stream,
 * all streams are verified together in one step; greedy output equals --spec none, sampled output has the
 * same distribution (not the same draws for a seed). --stats adds acceptance statistics.
 * --json-schema FILE | --json | --grammar FILE: constrained output (src/engine/constraint.h) in every mode; the
 * output is bounded to -n - 1 bytes so that it completes with EOS within -n tokens. */
#include "cli/cli.h"
#include "cli/gen_constraint.h"
#include "state/kvrows.h"
#include "engine/drafter_dspark.h"
#include "engine/drafter_mtp.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "util/error.h"
#include "util/fileio.h"
#include "text/strbuf.h"
#include "text/tokenizer.h"
#include "cli/prompts.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *CMD = "generate";

typedef struct {
    const char *model_dir, *prompt, *tokens, *spec, *batch;
    long long n, threads, draft, max_streams, step_tokens;
    double spec_threshold;   /* --spec-threshold: DSpark survival-product cut (0 = off) */
    const char *pcache_dir;  /* --prefix-cache-dir */
    long long pcache_mb;     /* --prefix-cache-mb */
    int ids, stats;
    dsv4_mode mode;
    int device;                 /* --device cpu|cuda */
    int gpus;                    /* --gpus N (0 = 1) */
    cli_placement place;   /* --gpu-mem, --expert-profile */
    int kv_format;       /* --kv f32|bf16|fp8 */
    dsv4_sampling sp;
    cli_constraint_opts con;
    int constrained;
} gen_opts;

static int parse(int argc, char **argv, gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->n = 64;
    o->sp.top_p = 1.0f;
    o->max_streams = 16;
    o->step_tokens = 256;
    o->con.ws = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
#define VAL() do { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model_dir = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VAL(); o->prompt = v; }
        else if (!strcmp(a, "--tokens")) { VAL(); o->tokens = v; }
        else if (!strcmp(a, "--batch")) { VAL(); o->batch = v; }
        else if (!strcmp(a, "--max-streams")) { VAL(); if (cli_parse_int(CMD, a, v, 1, 1 << 16, &o->max_streams)) return 1; }
        else if (!strcmp(a, "--step-tokens")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1 << 24, &o->step_tokens)) return 1; }
        else if (!strcmp(a, "-n")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1LL << 30, &o->n)) return 1; }
        else if ((r = cli_sampling_option(CMD, argc, argv, &i, &o->sp))) { if (r < 0) return 1; }
        else if (!strcmp(a, "--json")) o->con.json = 1;
        else if (!strcmp(a, "--json-schema")) { VAL(); o->con.schema_file = v; }
        else if (!strcmp(a, "--grammar")) { VAL(); o->con.grammar_file = v; }
        else if (!strcmp(a, "--json-ws")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 64, &o->con.ws)) return 1; }
        else if (!strcmp(a, "--threads")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1024, &o->threads)) return 1; }
        else if (!strcmp(a, "--kv")) {
            VAL();
            if ((o->kv_format = kv_format_parse(v)) < 0) return cli_error(CMD, "--kv must be f32, bf16 or fp8, got '%s'", v);
        }
        else if (!strcmp(a, "--spec")) { VAL(); o->spec = v; }
        else if (!strcmp(a, "--draft")) { VAL(); if (cli_parse_int(CMD, a, v, 1, 64, &o->draft)) return 1; }
        else if (!strcmp(a, "--prefix-cache-dir")) { VAL(); o->pcache_dir = v; }
        else if (!strcmp(a, "--prefix-cache-mb")) { VAL(); if (cli_parse_int(CMD, a, v, 1, 1LL << 30, &o->pcache_mb)) return 1; }
        else if (!strcmp(a, "--spec-threshold")) {
            VAL();
            if (cli_parse_float(CMD, a, v, &o->spec_threshold)) return 1;
            if (!(o->spec_threshold >= 0 && o->spec_threshold <= 1)) return cli_error(CMD, "--spec-threshold must be in [0, 1]");
        }
        else if (!strcmp(a, "--ids")) o->ids = 1;
        else if (!strcmp(a, "--stats")) o->stats = 1;
        else if (!strcmp(a, "--mode")) { VAL(); if (cli_parse_mode(CMD, v, &o->mode)) return 1; }
        else if (!strcmp(a, "--device")) { VAL(); if (cli_parse_device(CMD, v, &o->device)) return 1; }
        else if (!strcmp(a, "--gpus")) { VAL(); if (cli_parse_gpus(CMD, v, &o->gpus)) return 1; }
        else if ((r = cli_placement_option(CMD, argc, argv, &i, &o->place)) != 0) { if (r < 0) return 1; }
        else if (cli_amx_option(a, &o->place)) continue;
        else return cli_error(CMD, "unknown option '%s'", a);
#undef VAL
    }
    if (!o->model_dir) return cli_error(CMD, "missing -m DIR");
    if (!!o->prompt + !!o->tokens + !!o->batch != 1) return cli_error(CMD, "give exactly one of -p TEXT, --tokens and --batch");
    if (o->spec && strcmp(o->spec, "none") && strcmp(o->spec, "ngram") && strcmp(o->spec, "self") && strcmp(o->spec, "mtp") &&
        strcmp(o->spec, "dspark"))
        return cli_error(CMD, "--spec must be none, ngram, self, mtp or dspark, got '%s'", o->spec);
    if (!o->draft) o->draft = 4;
    if ((o->constrained = cli_constraint_wanted(CMD, &o->con)) < 0) return 1;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- --batch: many prompts through the continuous-batching scheduler ---------------------------------- */

/* Every prompt is a request with the command's sampling options; prompt i gets seed --seed + i, so its output
 * equals `dsv4 generate --tokens <line i> --seed <S+i>`. Prints "<i>: id,id,..." in prompt order. */
static int run_batch(const gen_opts *o) {
    dsv4_error err;
    dsv4_load_opts lo = { .mode = o->mode, .kv_format = o->kv_format, .n_threads = (int)o->threads, .quiet = 0,
                          .device = o->device, .n_gpus = o->gpus };
    cli_placement_apply(&o->place, &lo);
    dsv4_model *m = NULL;
    dsv4_tokenizer *tok = NULL;
    dsv4_sched *s = NULL;
    cli_prompts pl = {0};
    int64_t *ids = NULL;
    dsv4_grammar *gram = NULL;
    dsv4_cvocab *cv = NULL;
    dsv4_cmatcher *matcher = NULL;
    int rc = 1;
    if (dsv4_model_load(o->model_dir, &lo, &m, &err)) { rc = cli_fail(CMD, &err); goto out; }
    if (o->constrained) {
        dsv4_model_info info;
        dsv4_model_get_info(m, &info);
        if (cli_constraint_build(CMD, &o->con, o->model_dir, info.vocab_size, info.eos_id, &gram, &cv)) goto out;
        /* every prompt has the same constraint: one matcher, so its masks are computed once for all */
        if (dsv4_cmatcher_new(gram, cv, &matcher, &err)) { rc = cli_fail(CMD, &err); goto out; }
    }
    if (cli_read_prompts(CMD, o->batch, o->model_dir, &tok, &pl)) goto out;
    dsv4_sched_opts so = { (int)o->max_streams, (int)o->step_tokens };
    if (dsv4_sched_new(m, &so, &s, &err)) { rc = cli_fail(CMD, &err); goto out; }
    ids = calloc((size_t)pl.n, sizeof *ids);
    if (!ids) { rc = cli_error(CMD, "out of memory"); goto out; }
    for (int i = 0; i < pl.n; i++) {
        dsv4_request r = { pl.tok[i], pl.len[i], o->sp, (int)o->n, 1, NULL, 0, gram, cv, matcher };
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
    dsv4_cmatcher_free(matcher);
    dsv4_grammar_free(gram);
    dsv4_cvocab_free(cv);
    cli_prompts_free(&pl);
    if (tok) dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    return rc;
}

/* ---- --spec: speculative decoding, one stream per prompt ------------------------------------------------ */

static int make_drafter(const gen_opts *o, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *d, dsv4_error *err) {
    if (!strcmp(o->spec, "ngram")) return dsv4_drafter_ngram(1, 4, d, err);
    if (!strcmp(o->spec, "mtp")) return dsv4_drafter_mtp(m, sp, d, err);
    if (!strcmp(o->spec, "dspark")) return dsv4_drafter_dspark(m, sp, d, err);
    return dsv4_drafter_self(m, sp, d, err);
}

/* The prompt of -p / --tokens as the only entry of pl. */
static int single_prompt(const gen_opts *o, dsv4_tokenizer **tok, cli_prompts *pl) {
    dsv4_error err;
    int32_t *ids = NULL;
    int n = 0;
    if (o->prompt) {
        if (dsv4_tokenizer_load_dir(o->model_dir, tok, &err)) { *tok = NULL; return cli_error(CMD, "-p needs a tokenizer: %s", err.msg); }
        size_t nn = 0;
        if (dsv4_tokenizer_encode(*tok, o->prompt, strlen(o->prompt), 0, &ids, &nn, &err)) return cli_fail(CMD, &err);
        n = (int)nn;
    } else if (cli_parse_tokens(CMD, o->tokens, &ids, &n)) return 1;
    if (n == 0) { free(ids); return cli_error(CMD, "the prompt encodes to no tokens"); }
    pl->tok = malloc(sizeof *pl->tok);
    pl->len = malloc(sizeof *pl->len);
    if (!pl->tok || !pl->len) { free(ids); return cli_error(CMD, "out of memory"); }
    pl->tok[0] = ids;
    pl->len[0] = n;
    pl->n = pl->cap = 1;
    return 0;
}

static void print_spec_stats(const gen_opts *o, dsv4_spec_stream **ss, int n, double prefill_s, double decode_s, long long steps) {
    dsv4_spec_stats t = {0};
    for (int i = 0; i < n; i++) {
        dsv4_spec_stats st;
        dsv4_spec_stream_stats(ss[i], &st);
        t.proposed += st.proposed;
        t.accepted += st.accepted;
        t.emitted += st.emitted;
        t.steps += st.steps;
    }
    fprintf(stderr, "spec %s: draft %lld, %lld target steps, %lld drafts proposed, %lld accepted (%.1f %%), "
                    "%.2f tokens per target step and stream\n",
            o->spec, o->draft, steps, (long long)t.proposed, (long long)t.accepted,
            t.proposed ? 100.0 * (double)t.accepted / (double)t.proposed : 0.0,
            t.steps ? (double)t.emitted / (double)t.steps : 0.0);
    fprintf(stderr, "prefill: %.3f s; decode: %lld tokens in %.3f s (%.2f tok/s)\n", prefill_s, (long long)t.emitted,
            decode_s, decode_s > 0 ? (double)t.emitted / decode_s : 0.0);
}

static int run_spec(const gen_opts *o) {
    dsv4_error err;
    /* each step may roll back the anchor and every draft: the ring needs draft + 1 slots of slack */
    dsv4_load_opts lo = { .mode = o->mode, .kv_format = o->kv_format, .n_threads = (int)o->threads, .quiet = 1, .device = o->device, .n_gpus = o->gpus,
                          .max_spec = o->draft + 1 > 16 ? (int)o->draft + 1 : 16 };
    cli_placement_apply(&o->place, &lo);
    dsv4_model *m = NULL;
    dsv4_tokenizer *tok = NULL;
    cli_prompts pl = {0};
    dsv4_spec_stream **ss = NULL;
    dsv4_strbuf text;
    dsv4_sb_init(&text);
    dsv4_detokenizer detok;
    dsv4_grammar *gram = NULL;
    dsv4_cvocab *cv = NULL;
    dsv4_cmatcher *matcher = NULL;
    int rc = 1, n_ss = 0;
    if (dsv4_model_load(o->model_dir, &lo, &m, &err)) { rc = cli_fail(CMD, &err); goto out; }
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    const int32_t eos_id = info.eos_id;
    if (o->constrained && cli_constraint_build(CMD, &o->con, o->model_dir, info.vocab_size, info.eos_id, &gram, &cv)) goto out;
    if (gram && dsv4_cmatcher_new(gram, cv, &matcher, &err)) { rc = cli_fail(CMD, &err); goto out; } /* shared by all streams */
    if (o->batch ? cli_read_prompts(CMD, o->batch, o->model_dir, &tok, &pl) : single_prompt(o, &tok, &pl)) goto out;
    if (!o->batch && !o->ids && !tok && dsv4_tokenizer_load_dir(o->model_dir, &tok, &err)) tok = NULL;
    const int stream_text = !o->batch && !o->ids && tok;
    if (stream_text) dsv4_detokenizer_init(&detok, tok);
    ss = calloc((size_t)pl.n, sizeof *ss);
    if (!ss) { rc = cli_error(CMD, "out of memory"); goto out; }
    const double t0 = now_s();
    for (; n_ss < pl.n; n_ss++) {
        dsv4_sampling sp = o->sp;
        sp.seed = o->sp.seed + (uint64_t)n_ss;
        dsv4_spec_opts so = { .draft = (int)o->draft, .max_new_tokens = (int)o->n, .stop_on_eos = 1,
                              .conf_threshold = (float)o->spec_threshold, .matcher = matcher };
        dsv4_drafter d;
        if (make_drafter(o, m, &sp, &d, &err) ||
            dsv4_spec_stream_new(m, pl.tok[n_ss], pl.len[n_ss], &sp, &so, &d, &ss[n_ss], &err)) {
            if (o->batch) dsv4_wrap(&err, "prompt %d", n_ss);
            rc = cli_fail(CMD, &err);
            goto out;
        }
    }
    const double t1 = now_s();
    long long steps = 0;
    for (;;) {
        int live = 0;
        for (int i = 0; i < n_ss; i++) live += !dsv4_spec_stream_done(ss[i]);
        if (!live) break;
        if (dsv4_spec_step(m, ss, n_ss, &err)) { rc = cli_fail(CMD, &err); goto out; }
        steps++;
        if (stream_text) {
            int n;
            const int32_t *outp = dsv4_spec_stream_output(ss[0], &n);
            for (int j = n - dsv4_spec_stream_last_emitted(ss[0]); j < n; j++)
                if (!(gram && outp[j] == eos_id) && /* constrained text ends with the value, not EOS */
                    dsv4_detokenizer_push(&detok, outp[j], &text, &err)) { rc = cli_fail(CMD, &err); goto out; }
            fwrite(text.data, 1, text.len, stdout);
            fflush(stdout);
            dsv4_sb_clear(&text);
        }
    }
    const double t2 = now_s();
    for (int i = 0; i < n_ss; i++) {
        int n;
        const int32_t *outp = dsv4_spec_stream_output(ss[i], &n);
        if (stream_text) {
            dsv4_detokenizer_finish(&detok, &text);
            fwrite(text.data, 1, text.len, stdout);
            printf("\n");
            continue;
        }
        if (o->batch) printf("%d: ", i);
        for (int k = 0; k < n; k++) printf(k ? ",%d" : "%d", outp[k]);
        printf("\n");
    }
    if (o->stats) print_spec_stats(o, ss, n_ss, t1 - t0, t2 - t1, steps);
    rc = 0;
out:
    for (int i = 0; i < n_ss; i++) dsv4_spec_stream_free(ss[i]);
    free(ss);
    dsv4_cmatcher_free(matcher);
    dsv4_grammar_free(gram);
    dsv4_cvocab_free(cv);
    dsv4_sb_free(&text);
    cli_prompts_free(&pl);
    if (tok) dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    return rc;
}

/* Feed tokens and (next != NULL) draw the next one. Unconstrained, the step draws it on the model's device and only
 * the id comes back; constrained, the row comes back to be masked first (both: draw number smp->counter, which
 * then advances). */
static int step_and_draw(dsv4_model *m, dsv4_seq *seq, const int32_t *tokens, int n, dsv4_sampler *smp, dsv4_cstate *cs,
                         float *logits, int32_t *next, dsv4_error *err) {
    dsv4_step_item it = { seq, tokens, n, cs && next ? DSV4_LOGITS_LAST : DSV4_LOGITS_NONE, cs && next ? logits : NULL };
    if (!next) return dsv4_step(m, &it, 1, err);
    if (!cs) {
        it.sample = &smp->params;
        it.draw = smp->counter;
        it.token = next;
    }
    int rc = dsv4_step(m, &it, 1, err);
    if (rc) return rc;
    if (!cs) {
        smp->counter++;
        return 0;
    }
    /* constrained: disallowed tokens get -inf before temperature and filters */
    if ((rc = dsv4_cstate_mask(cs, logits, err))) return rc;
    *next = dsv4_sample(smp, logits);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    if (parse(argc, argv, &o)) return 1;
    if (o.spec && strcmp(o.spec, "none")) return run_spec(&o);
    if (o.batch) return run_batch(&o);
    dsv4_error err;
    dsv4_load_opts lo = { .mode = o.mode, .kv_format = o.kv_format, .n_threads = (int)o.threads, .quiet = 0,
                          .device = o.device, .n_gpus = o.gpus };
    cli_placement_apply(&o.place, &lo);
    dsv4_model *m = NULL;
    dsv4_tokenizer *tok = NULL;
    dsv4_seq *seq = NULL;
    dsv4_sampler smp = {0};
    int32_t *prompt = NULL, *out_ids = NULL;
    size_t n_prompt = 0;
    float *logits = NULL;
    dsv4_prefix_cache *pcache = NULL;
    dsv4_grammar *gram = NULL;
    dsv4_cvocab *cv = NULL;
    dsv4_cstate *cs = NULL;
    int64_t matched = 0, reused = 0;
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
    if (o.constrained) {
        if (cli_constraint_build(CMD, &o.con, o.model_dir, info.vocab_size, info.eos_id, &gram, &cv)) goto out;
        if (dsv4_cstate_new(gram, cv, o.n - 1, &cs, &err)) { rc = cli_fail(CMD, &err); goto out; }
    }
    if (o.pcache_dir) {
        /* the longest stored prefix of prompt[0..n-1) is forked; the rest is processed and stored in turn */
        const size_t budget = (size_t)(o.pcache_mb ? o.pcache_mb : 1024) << 20;
        if (dsv4_prefix_cache_new(budget, &pcache, &err) || dsv4_prefix_cache_set_dir(pcache, o.pcache_dir, budget, &err) ||
            dsv4_prefix_cache_lookup(pcache, m, prompt, (int64_t)n_prompt - 1, &seq, &matched, &err)) {
            rc = cli_fail(CMD, &err);
            goto out;
        }
        reused = matched;
    } else if (dsv4_seq_new(m, &seq, &err)) { rc = cli_fail(CMD, &err); goto out; }
    logits = malloc(sizeof(float) * (size_t)info.vocab_size);
    out_ids = malloc(sizeof(int32_t) * (size_t)(o.n + 1));
    if (!logits || !out_ids) { rc = cli_error(CMD, "out of memory"); goto out; }
    if (tok) dsv4_detokenizer_init(&detok, tok);

    double t0 = now_s();
    if (pcache && (int64_t)n_prompt - 1 > matched) {
        dsv4_step_item pre = { seq, prompt + matched, (int)((int64_t)n_prompt - 1 - matched), DSV4_LOGITS_NONE, NULL };
        if (dsv4_step(m, &pre, 1, &err) || dsv4_prefix_cache_put(pcache, seq, &err)) { rc = cli_fail(CMD, &err); goto out; }
        matched = (int64_t)n_prompt - 1;
    }
    int32_t next = 0;
    if (step_and_draw(m, seq, prompt + matched, (int)((int64_t)n_prompt - matched), &smp, cs, logits, o.n > 0 ? &next : NULL, &err)) {
        rc = cli_fail(CMD, &err);
        goto out;
    }
    double t1 = now_s();
    long long n_out = 0;
    while (n_out < o.n) {
        if (cs && dsv4_cstate_advance(cs, next, &err)) { rc = cli_fail(CMD, &err); goto out; }
        out_ids[n_out++] = next;
        if (!o.ids && tok && !(cs && next == info.eos_id)) { /* constrained text ends with the value, not EOS */
            if (dsv4_detokenizer_push(&detok, next, &text, &err)) { rc = cli_fail(CMD, &err); goto out; }
            fwrite(text.data, 1, text.len, stdout);
            fflush(stdout);
            dsv4_sb_clear(&text);
        }
        if (next == info.eos_id || n_out == o.n) break;
        const int32_t fed = next;
        if (step_and_draw(m, seq, &fed, 1, &smp, cs, logits, &next, &err)) { rc = cli_fail(CMD, &err); goto out; }
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
    if (o.stats && pcache) {
        dsv4_prefix_cache_stats ps;
        dsv4_prefix_cache_get_stats(pcache, &ps);
        fprintf(stderr, "prefix cache: %lld hit(s), %lld miss(es), %lld disk hit(s), %lld disk write(s), %lld rejected; "
                "reused %lld prompt tokens\n", (long long)ps.hits, (long long)ps.misses, (long long)ps.disk_hits,
                (long long)ps.disk_writes, (long long)ps.disk_rejected, (long long)reused);
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
    dsv4_cstate_free(cs);
    dsv4_grammar_free(gram);
    dsv4_cvocab_free(cv);
    dsv4_prefix_cache_free(pcache);
    dsv4_seq_free(seq);
    if (tok) dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    return rc;
}
