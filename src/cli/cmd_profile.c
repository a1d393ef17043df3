/* dsv4 profile -m DIR --file PROMPTS [--out FILE] [--generate N] [--device cpu|cuda] [--gpu-mem GB] ...
 * Runs prompts through the model and records how often each main layer routes to each expert (issue 15): the
 * routing profile the loader uses to keep the most used experts on the GPU when not all fit
 * (model/expert_profile.h). Each prompt is prefilled in a fresh sequence (chunks of --chunk tokens), then
 * --generate N greedy tokens are decoded, so the profile sees the model's own output too. Counts are integers:
 * the same prompts give the same file on every device, batch size and chunking. Written to FILE, by default
 * DIR/expert_profile.json, where loads find it. */
#include "cli/cli.h"
#include "cli/prompts.h"
#include "model/expert_profile.h"
#include "model/model.h"
#include "model/route_count.h"
#include "util/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD "profile"

typedef struct {
    const char *model_dir, *file, *out;
    long long generate, chunk, threads;
    int device, gpus;
    dsv4_mode mode;
    cli_placement place;
} profile_opts;

static int parse(int argc, char **argv, profile_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
#define VAL() do { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { cli_help_command(stdout, CMD); exit(0); }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model_dir = v; }
        else if (!strcmp(a, "--file")) { VAL(); o->file = v; }
        else if (!strcmp(a, "--out")) { VAL(); o->out = v; }
        else if (!strcmp(a, "--generate")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1 << 20, &o->generate)) return 1; }
        else if (!strcmp(a, "--chunk")) { VAL(); if (cli_parse_int(CMD, a, v, 1, 1 << 16, &o->chunk)) return 1; }
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
    if (!o->file) return cli_error(CMD, "missing --file PROMPTS (one prompt per line: text, or token ids 1,2,3)");
    return 0;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;   /* ties to the lower id */
    return best;
}

/* One prompt: prefill in chunks, then greedy tokens; every step's routes are counted. */
static int run_prompt(dsv4_model *m, const int32_t *tok, int len, const profile_opts *o, float *logits, dsv4_error *err) {
    dsv4_seq *s;
    int rc = dsv4_seq_new(m, &s, err);
    for (int at = 0; !rc && at < len; at += (int)o->chunk) {
        const int n = len - at < o->chunk ? len - at : (int)o->chunk;
        dsv4_step_item it = { .seq = s, .tokens = tok + at, .n_tokens = n,
                              .want = at + n == len && o->generate ? DSV4_LOGITS_LAST : DSV4_LOGITS_NONE, .logits = logits };
        rc = dsv4_step(m, &it, 1, err);
    }
    for (long long g = 0; !rc && g < o->generate; g++) {
        const int32_t next = argmax(logits, m->cfg.vocab_size);
        dsv4_step_item it = { .seq = s, .tokens = &next, .n_tokens = 1, .want = DSV4_LOGITS_LAST, .logits = logits };
        rc = dsv4_step(m, &it, 1, err);
    }
    dsv4_seq_free(s);
    return rc;
}

/* How concentrated the routing is: the share of routes the most used tenth of each layer's experts (at least
 * one) took, averaged over the layers; uniform routing gives top / E. */
static int top_tenth(int E) { return E / 10 > 0 ? E / 10 : 1; }
static double top_tenth_share(const expert_profile *p) {
    const int E = p->n_routed, top = top_tenth(E);
    uint64_t *row = malloc(sizeof *row * (size_t)E);
    if (!row) return 0;
    double sum = 0;
    for (int l = 0; l < p->n_layers; l++) {
        memcpy(row, p->counts + (size_t)l * E, sizeof *row * (size_t)E);
        uint64_t all = 0, best = 0;
        for (int e = 0; e < E; e++) all += row[e];
        for (int k = 0; k < top; k++) {   /* top selections by repeated max: E is a few hundred */
            int b = 0;
            for (int e = 1; e < E; e++)
                if (row[e] > row[b]) b = e;
            best += row[b];
            row[b] = 0;
        }
        sum += all ? (double)best / (double)all : 0;
    }
    free(row);
    return sum / p->n_layers;
}

int cmd_profile(int argc, char **argv) {
    profile_opts o = { .chunk = 512, .device = DSV4_DEVICE_CPU, .gpus = 1, .mode = DSV4_MODE_EXACT };
    if (parse(argc, argv, &o)) return 1;
    char out_path[4096];
    if (o.out) snprintf(out_path, sizeof out_path, "%s", o.out);
    else snprintf(out_path, sizeof out_path, "%s/%s", o.model_dir, EXPERT_PROFILE_FILE);
    dsv4_tokenizer *tok = NULL;
    cli_prompts pl = { 0 };
    dsv4_model *m = NULL;
    float *logits = NULL;
    expert_profile prof = { 0 };
    dsv4_error err;
    int rc = cli_read_prompts(CMD, o.file, o.model_dir, &tok, &pl);
    if (!rc) {
        dsv4_load_opts lo = { .mode = o.mode, .n_threads = (int)o.threads, .device = o.device, .n_gpus = o.gpus };
        cli_placement_apply(&o.place, &lo);
        /* the profile being written is not read back (it may be missing or stale): where this run's experts live
         * does not change the counts */
        if (!lo.expert_profile) lo.expert_profile = "";
        if (dsv4_model_load(o.model_dir, &lo, &m, &err)) rc = cli_fail(CMD, &err);
    }
    if (!rc && !(logits = malloc(sizeof(float) * (size_t)m->cfg.vocab_size))) rc = cli_error(CMD, "out of memory");
    if (!rc && model_count_routes(m, 1, &err)) rc = cli_fail(CMD, &err);
    for (int i = 0; i < pl.n && !rc; i++)
        if (run_prompt(m, pl.tok[i], pl.len[i], &o, logits, &err)) rc = cli_error(CMD, "prompt %d: %s", i, err.msg);
    if (!rc && model_route_profile(m, &prof, &err)) rc = cli_fail(CMD, &err);
    if (!rc && expert_profile_save(&prof, out_path, &err)) rc = cli_fail(CMD, &err);
    if (!rc)
        printf("profile: %d prompts, %llu tokens, %d layers x %d experts; the most used %d of each layer's experts took "
               "%.1f%% of its routes (uniform: %.1f%%); written to %s\n", pl.n, (unsigned long long)prof.tokens, prof.n_layers,
               prof.n_routed, top_tenth(prof.n_routed), 100.0 * top_tenth_share(&prof), 100.0 * top_tenth(prof.n_routed) / prof.n_routed,
               out_path);
    expert_profile_free(&prof);
    free(logits);
    dsv4_model_free(m);
    cli_prompts_free(&pl);
    if (tok) dsv4_tokenizer_free(tok);
    return rc;
}
