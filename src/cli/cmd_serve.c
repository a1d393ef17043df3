/* dsv4 serve -m DIR [--host 127.0.0.1] [--port 8000] [--device cpu|cuda] [--api-key KEY] [--max-streams N]
 *            [--ctx N] [--kv f32|bf16|fp8] [--mode exact|official] [--spec none|ngram|mtp|dspark|self]
 *            [--draft N] [--spec-threshold X] [--prefix-cache-mb N]
 *            [--prefix-cache-dir DIR [--prefix-cache-disk-mb N]] [--served-model-name NAME] [--encoder v4|v4-0731]
 *            [--threads N] [--step-tokens N] [--max-queue N] [--max-connections N] [--max-body-mb N]
 * An OpenAI- and Anthropic-compatible HTTP server over the continuous-batching engine (src/server/). Prints
 * exactly `dsv4: listening on http://HOST:PORT` on stderr once it accepts requests; SIGINT / SIGTERM stop it:
 * no new connections, every running stream is cancelled (its client sees it end), exit 0. */
#include "cli/cli.h"
#include "engine/drafter_named.h"
#include "server/engine.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/server.h"
#include "state/kvrows.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *CMD = "serve";

typedef struct {
    const char *model_dir, *host, *api_key, *spec, *pcache_dir, *served_name, *encoder;
    long long port, max_streams, ctx, pcache_mb, pcache_disk_mb, threads, step_tokens, max_queue, max_conn, max_body_mb, draft;
    double spec_threshold;
    int kv_format;
    int device;          /* a dsv4_device */
    int gpus;             /* --gpus N (0 = 1) */
    cli_placement place;   /* --gpu-mem, --expert-profile */
    dsv4_mode mode;
} serve_opts;

static int parse(int argc, char **argv, serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->spec = "none";
    o->encoder = "v4";
    o->max_streams = 16;
    o->pcache_mb = 1024;
    o->pcache_disk_mb = 4096;
    o->step_tokens = 512;
    o->max_queue = 256;
    o->max_conn = 512;
    o->max_body_mb = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
#define VAL() do { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; } while (0)
#define INT(lo, hi, dst) do { VAL(); if (cli_parse_int(CMD, a, v, lo, hi, dst)) return 1; } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model_dir = v; }
        else if (!strcmp(a, "--host")) { VAL(); o->host = v; }
        else if (!strcmp(a, "--port")) INT(0, 65535, &o->port);
        else if (!strcmp(a, "--device")) { VAL(); if (cli_parse_device(CMD, v, &o->device)) return 1; }
        else if (!strcmp(a, "--gpus")) { VAL(); if (cli_parse_gpus(CMD, v, &o->gpus)) return 1; }
        else if ((r = cli_placement_option(CMD, argc, argv, &i, &o->place)) != 0) { if (r < 0) return 1; }
        else if (cli_amx_option(a, &o->place)) continue;
        else if (!strcmp(a, "--api-key")) { VAL(); o->api_key = v; }
        else if (!strcmp(a, "--max-streams")) INT(1, 4096, &o->max_streams);
        else if (!strcmp(a, "--ctx")) INT(2, 1LL << 31, &o->ctx);
        else if (!strcmp(a, "--kv")) {
            VAL();
            if ((o->kv_format = kv_format_parse(v)) < 0) return cli_error(CMD, "--kv must be f32, bf16 or fp8, got '%s'", v);
        }
        else if (!strcmp(a, "--mode")) { VAL(); if (cli_parse_mode(CMD, v, &o->mode)) return 1; }
        else if (!strcmp(a, "--spec")) { VAL(); o->spec = v; }
        else if (!strcmp(a, "--draft")) INT(1, 64, &o->draft);
        else if (!strcmp(a, "--spec-threshold")) {
            VAL();
            if (cli_parse_float(CMD, a, v, &o->spec_threshold)) return 1;
            if (!(o->spec_threshold >= 0 && o->spec_threshold <= 1)) return cli_error(CMD, "--spec-threshold must be in [0, 1]");
        }
        else if (!strcmp(a, "--prefix-cache-mb")) INT(0, 1LL << 30, &o->pcache_mb);
        else if (!strcmp(a, "--prefix-cache-dir")) { VAL(); o->pcache_dir = v; }
        else if (!strcmp(a, "--prefix-cache-disk-mb")) INT(1, 1LL << 30, &o->pcache_disk_mb);
        else if (!strcmp(a, "--served-model-name")) { VAL(); o->served_name = v; }
        else if (!strcmp(a, "--encoder")) { VAL(); o->encoder = v; }
        else if (!strcmp(a, "--threads")) INT(0, 1024, &o->threads);
        else if (!strcmp(a, "--step-tokens")) INT(0, 1 << 24, &o->step_tokens);
        else if (!strcmp(a, "--max-queue")) INT(0, 1 << 20, &o->max_queue);
        else if (!strcmp(a, "--max-connections")) INT(1, 1 << 16, &o->max_conn);
        else if (!strcmp(a, "--max-body-mb")) INT(1, 1024, &o->max_body_mb);
        else return cli_error(CMD, "unknown option '%s'", a);
#undef INT
#undef VAL
    }
    if (!o->model_dir) return cli_error(CMD, "missing -m DIR");
    if (strcmp(o->spec, "none") && !dsv4_drafter_name_known(o->spec))
        return cli_error(CMD, "--spec must be none, ngram, mtp, dspark or self, got '%s'", o->spec);
    if (strcmp(o->encoder, "v4") && strcmp(o->encoder, "v4-0731"))
        return cli_error(CMD, "--encoder must be v4 or v4-0731, got '%s'", o->encoder);
    if (o->pcache_dir && o->pcache_mb == 0) return cli_error(CMD, "--prefix-cache-dir needs --prefix-cache-mb > 0");
    if (o->api_key && !*o->api_key) return cli_error(CMD, "--api-key must not be empty");
    return 0;
}

/* The served name when --served-model-name is absent: the folder's last component, into buf. */
static const char *default_name(const char *dir, char *buf, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(buf, cap, "%.*s", (int)(n - start), dir + start);
    return buf;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    if (parse(argc, argv, &o)) return 1;
    /* SIGINT / SIGTERM are blocked in every thread (the mask is inherited by the engine, pool and connection
     * threads created below) and taken synchronously by sigwait in this thread: no handler, no global flag. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);   /* a client that went away must not kill the server */

    dsv4_error err;
    /* the same load path for both devices: the scheduler and the server do not care where steps run */
    /* a speculative step rolls back at most its drafts: the rings keep max_spec > draft slots of slack */
    dsv4_load_opts lo = {.mode = o.mode, .kv_format = o.kv_format, .n_threads = (int)o.threads, .quiet = 1,
                         .device = o.device, .n_gpus = o.gpus, .max_spec = o.draft + 1 > 16 ? (int)o.draft + 1 : 16};
    cli_placement_apply(&o.place, &lo);
    dsv4_model *m = NULL;
    dsv4_tokenizer *tok = NULL;
    dsv4_prefix_cache *pc = NULL;
    dsv4_cvocab *cvocab = NULL;
    server_engine *eng = NULL;
    server_http *http = NULL;
    server_metrics metrics;
    server_metrics_init(&metrics);
    int rc = 1;
    if (dsv4_model_load(o.model_dir, &lo, &m, &err)) { rc = cli_fail(CMD, &err); goto out; }
    if (dsv4_tokenizer_load_dir(o.model_dir, &tok, &err)) { tok = NULL; rc = cli_error(CMD, "the model needs a tokenizer: %s", err.msg); goto out; }
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    if (dsv4_tokenizer_vocab_size(tok) > info.vocab_size)
        { rc = cli_error(CMD, "the tokenizer has %d ids but the model only %d", dsv4_tokenizer_vocab_size(tok), info.vocab_size); goto out; }
    /* the vocabulary trie for response_format, built once (tens of ms on the real vocabulary) */
    if (dsv4_cvocab_from_tokenizer(tok, info.vocab_size, info.eos_id, &cvocab, &err)) { rc = cli_fail(CMD, &err); goto out; }
    if (o.pcache_mb > 0) {
        if (dsv4_prefix_cache_new((size_t)o.pcache_mb << 20, &pc, &err)) { rc = cli_fail(CMD, &err); goto out; }
        if (o.pcache_dir && dsv4_prefix_cache_set_dir(pc, o.pcache_dir, (size_t)o.pcache_disk_mb << 20, &err)) { rc = cli_fail(CMD, &err); goto out; }
    }
    const int64_t ctx = o.ctx ? o.ctx : (info.max_position < 65536 ? info.max_position : 65536);
    if (ctx > info.max_position) { rc = cli_error(CMD, "--ctx %lld exceeds the model's %lld positions", (long long)ctx, (long long)info.max_position); goto out; }
    server_engine_opts eo = {(int)o.max_streams, (int)o.step_tokens, (int)o.max_queue, pc, o.spec, (int)o.draft,
                             (float)o.spec_threshold};
    if (!eo.draft) eo.draft = dsv4_drafter_default_draft(o.spec, m);
    if (server_engine_start(m, &eo, &eng, &err)) { rc = cli_fail(CMD, &err); goto out; }

    server_ctx srv;
    memset(&srv, 0, sizeof srv);
    srv.tok = tok;
    srv.cvocab = cvocab;
    srv.engine = eng;
    srv.metrics = &metrics;
    char name_buf[256];
    srv.model_name = o.served_name ? o.served_name : default_name(o.model_dir, name_buf, sizeof name_buf);
    srv.limits = (server_parse_limits){.max_n = 16, .max_stop = 16, .max_top_logprobs = SERVER_MAX_TOP_LOGPROBS,
                                       .served_model = srv.model_name, .encoder_0731 = !strcmp(o.encoder, "v4-0731")};
    srv.api_key = o.api_key;
    srv.max_body = (size_t)o.max_body_mb << 20;
    srv.ctx = ctx;
    srv.vocab = info.vocab_size;
    srv.eos_id = dsv4_tokenizer_token_id(tok, DSV4_EOS_TEXT);
    srv.user_id = dsv4_tokenizer_token_id(tok, DSV4_USER_TEXT);
    srv.model_eos = info.eos_id;
    srv.poll_ms = 50;
    srv.created = (long)time(NULL);
    atomic_init(&srv.next_id, 1);

    server_http_opts ho = {o.host, (int)o.port, (int)o.max_conn};
    int port = 0;
    if (server_http_start(&srv, &ho, &http, &port, &err)) { rc = cli_fail(CMD, &err); goto out; }
    const int v6 = strchr(o.host, ':') != NULL;
    fprintf(stderr, "dsv4: listening on http://%s%s%s:%d\n", v6 ? "[" : "", o.host, v6 ? "]" : "", port);
    fflush(stderr);

    int sig = 0;
    while (sigwait(&stop_signals, &sig) != 0) {}
    /* stop: no new connections, cancel every stream (readers see their jobs end and close their responses),
     * then join the connection threads */
    server_http_quiesce(http);
    server_engine_stop(eng);
    server_http_stop(http);
    http = NULL;
    rc = 0;
out:
    server_http_stop(http);
    server_engine_free(eng);
    dsv4_prefix_cache_free(pc);
    dsv4_cvocab_free(cvocab);
    if (tok) dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    server_metrics_destroy(&metrics);
    return rc;
}
