/* dsv4 chat -m DIR [--system TEXT] [--think] [-n MAX_TOKENS_PER_TURN] [--temp T] [--top-p P] [--top-k K]
 *           [--min-p P] [--seed S] [--mode exact|official] [--threads N] [--stats]
 * Interactive multi-turn chat on one sequence (engine/chat_session.h has the multi-turn rules). Reads user lines
 * from stdin (terminal or pipe), streams each reply to stdout. Commands: /think, /nothink, /reset, /quit; EOF ends.
 * Ctrl-C during a reply stops it (the turn is closed and kept, see dsv4_chat_session_close); Ctrl-C at the prompt
 * arms exit, a second one exits. --stats: after each reply, one stderr line "[turn K: N tokens, position P]". */
#include "cli/cli.h"
#include "state/kvrows.h"
#include "engine/chat_session.h"
#include "text/tokenizer.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *CMD = "chat";

typedef struct {
    const char *model_dir, *system;
    int think, stats;
    long long n, threads;
    dsv4_mode mode;
    int kv_format;       /* --kv f32|bf16|fp8 */
    int device;          /* --device cpu|cuda */
    int gpus;             /* --gpus N (0 = 1) */
    cli_placement place;   /* --gpu-mem, --expert-profile */
    const char *pcache_dir;  /* --prefix-cache-dir */
    long long pcache_mb;     /* --prefix-cache-mb */
    dsv4_sampling sp;
} chat_opts;

static int parse(int argc, char **argv, chat_opts *o) {
    memset(o, 0, sizeof *o);
    o->n = 512;
    o->sp.top_p = 1.0f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
#define VAL() do { if (!(v = cli_value(CMD, argc, argv, &i))) return 1; } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model_dir = v; }
        else if (!strcmp(a, "--system")) { VAL(); o->system = v; }
        else if (!strcmp(a, "--think")) o->think = 1;
        else if (!strcmp(a, "--stats")) o->stats = 1;
        else if (!strcmp(a, "--prefix-cache-dir")) { VAL(); o->pcache_dir = v; }
        else if (!strcmp(a, "--prefix-cache-mb")) { VAL(); if (cli_parse_int(CMD, a, v, 1, 1LL << 30, &o->pcache_mb)) return 1; }
        else if (!strcmp(a, "-n")) { VAL(); if (cli_parse_int(CMD, a, v, 1, 1LL << 30, &o->n)) return 1; }
        else if ((r = cli_sampling_option(CMD, argc, argv, &i, &o->sp))) { if (r < 0) return 1; }
        else if (!strcmp(a, "--threads")) { VAL(); if (cli_parse_int(CMD, a, v, 0, 1024, &o->threads)) return 1; }
        else if (!strcmp(a, "--kv")) {
            VAL();
            if ((o->kv_format = kv_format_parse(v)) < 0) return cli_error(CMD, "--kv must be f32, bf16 or fp8, got '%s'", v);
        }
        else if (!strcmp(a, "--mode")) { VAL(); if (cli_parse_mode(CMD, v, &o->mode)) return 1; }
        else if (!strcmp(a, "--device")) { VAL(); if (cli_parse_device(CMD, v, &o->device)) return 1; }
        else if (!strcmp(a, "--gpus")) { VAL(); if (cli_parse_gpus(CMD, v, &o->gpus)) return 1; }
        else if ((r = cli_placement_option(CMD, argc, argv, &i, &o->place)) != 0) { if (r < 0) return 1; }
        else if (cli_amx_option(a, &o->place)) continue;
        else return cli_error(CMD, "unknown option '%s'", a);
#undef VAL
    }
    if (!o->model_dir) return cli_error(CMD, "missing -m DIR");
    return 0;
}

/* ---- Ctrl-C: the handler only counts; the loops decide what an interrupt means where they are ---------- */

static volatile sig_atomic_t g_interrupts;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupts++;
}

/* No SA_RESTART: a Ctrl-C at the prompt must make the blocked read return (EINTR) instead of resuming it. */
static void install_sigint(struct sigaction *old) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, old);
}

/* ---- display ------------------------------------------------------------------------------------------- */

typedef struct {
    int tty;             /* stdout is a terminal: reasoning dimmed */
    int in_reasoning;    /* the dim attribute is on */
    int saw_reasoning;
} display;

static void put(const char *s, size_t n) {
    fwrite(s, 1, n, stdout);
    fflush(stdout);
}

static void show_reasoning(void *ud, const char *s, size_t n) {
    display *d = ud;
    if (d->tty && !d->in_reasoning) put("\033[2m", 4);
    d->in_reasoning = d->saw_reasoning = 1;
    put(s, n);
}

/* Leaving the reasoning: reset the attribute, and on a terminal put the answer on its own line. */
static void end_reasoning(display *d) {
    if (!d->in_reasoning) return;
    d->in_reasoning = 0;
    if (d->tty) put("\033[0m\n", 5);
}

static void show_content(void *ud, const char *s, size_t n) {
    display *d = ud;
    end_reasoning(d);
    put(s, n);
}

static void show_raw(void *ud, const char *s, size_t n) { show_content(ud, s, n); }

static void show_call(void *ud, const dsv4_tool_call *c) {
    display *d = ud;
    end_reasoning(d);
    printf("\n[tool call %s %s]", c->name, c->arguments);
    fflush(stdout);
}

/* ---- the REPL ------------------------------------------------------------------------------------------ */

typedef struct {
    dsv4_chat_session *s;
    display disp;
    long long max_tokens;
    int tty_in, stats, turn;
} repl;

/* Generate one reply. The loop polls g_interrupts between tokens, so an interrupt never lands inside a step:
 * every token shown was fed, then close() completes the turn (see dsv4_chat_session_close). */
static int reply(repl *r, dsv4_error *err) {
    r->disp.in_reasoning = r->disp.saw_reasoning = 0;
    int done = 0, stopped = 0, n_reply = 0;
    for (long long i = 0; i < r->max_tokens && !done; i++) {
        if (g_interrupts) { stopped = 1; break; }
        int32_t tok;
        if (dsv4_chat_session_next(r->s, &tok, &done, err)) return err->code;
    }
    if (g_interrupts) stopped = 1;
    n_reply = dsv4_chat_session_reply_len(r->s);
    int rc = dsv4_chat_session_close(r->s, err);
    end_reasoning(&r->disp);
    put("\n", 1);
    if (stopped) fprintf(stderr, "[reply interrupted]\n");
    else if (!done) fprintf(stderr, "[reply cut at %lld tokens]\n", r->max_tokens);
    r->turn++;
    if (!rc && r->stats)
        fprintf(stderr, "[turn %d: %d tokens, position %lld]\n", r->turn, n_reply,
                (long long)dsv4_chat_session_position(r->s));
    return rc;
}

/* One command line; returns 1 when the chat should end. */
static int command(repl *r, const char *line, int *quit, dsv4_error *err) {
    *quit = 0;
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) { *quit = 1; return 0; }
    if (!strcmp(line, "/think")) { dsv4_chat_session_set_thinking(r->s, 1); fprintf(stderr, "[thinking mode]\n"); return 0; }
    if (!strcmp(line, "/nothink")) { dsv4_chat_session_set_thinking(r->s, 0); fprintf(stderr, "[chat mode]\n"); return 0; }
    if (!strcmp(line, "/reset")) {
        if (dsv4_chat_session_reset(r->s, err)) return err->code;
        fprintf(stderr, "[new conversation]\n");
        return 0;
    }
    fprintf(stderr, "[unknown command %s: /think, /nothink, /reset, /quit]\n", line);
    return 0;
}

/* Read a line (without its newline) into *line. Returns 1 for a line, 0 at EOF, -1 when Ctrl-C came. */
static int read_line(repl *r, char **line, size_t *cap) {
    if (r->tty_in) { fputs("> ", stdout); fflush(stdout); }
    errno = 0;
    ssize_t n = getline(line, cap, stdin);
    if (n < 0) {
        if (errno == EINTR || g_interrupts) { clearerr(stdin); return -1; }
        return 0;
    }
    while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r')) (*line)[--n] = 0;
    return 1;
}

static int run(repl *r, dsv4_error *err) {
    char *line = NULL;
    size_t cap = 0;
    int rc = 0, armed = 0;   /* armed: one Ctrl-C seen since the last input line; the next exits */
    for (;;) {
        if (g_interrupts) { armed = 1; g_interrupts = 0; }
        int got = read_line(r, &line, &cap);
        if (got == 0) break;
        if (got < 0) {
            g_interrupts = 0;
            if (armed) { put("\n", 1); break; }
            armed = 1;
            fprintf(stderr, "\n[Ctrl-C again or /quit to exit]\n");
            continue;
        }
        armed = 0;
        if (!*line) continue;
        if (line[0] == '/') {
            int quit;
            if ((rc = command(r, line, &quit, err)) || quit) break;
            continue;
        }
        if ((rc = dsv4_chat_session_user(r->s, line, err))) break;
        if ((rc = reply(r, err))) break;
    }
    free(line);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    chat_opts o;
    if (parse(argc, argv, &o)) return 1;
    dsv4_error err = {0};
    dsv4_load_opts lo = { .mode = o.mode, .kv_format = o.kv_format, .n_threads = (int)o.threads, .quiet = 1,
                          .device = o.device, .n_gpus = o.gpus };
    cli_placement_apply(&o.place, &lo);
    dsv4_model *m = NULL;
    dsv4_tokenizer *tok = NULL;
    dsv4_prefix_cache *pcache = NULL;
    repl r = { .max_tokens = o.n, .tty_in = isatty(STDIN_FILENO), .stats = o.stats };
    r.disp.tty = isatty(STDOUT_FILENO);
    int rc = 1;
    if (dsv4_model_load(o.model_dir, &lo, &m, &err)) { rc = cli_fail(CMD, &err); goto out; }
    if (dsv4_tokenizer_load_dir(o.model_dir, &tok, &err)) { tok = NULL; rc = cli_error(CMD, "needs a tokenizer: %s", err.msg); goto out; }
    dsv4_chat_session_opts so = { .system = o.system, .thinking = o.think, .sampling = o.sp,
                                  .show = { show_reasoning, show_content, show_call, &r.disp }, .on_raw = show_raw };
    if (dsv4_chat_session_new(m, tok, &so, &r.s, &err)) { rc = cli_fail(CMD, &err); goto out; }
    if (o.pcache_dir) {
        const size_t budget = (size_t)(o.pcache_mb ? o.pcache_mb : 1024) << 20;
        if (dsv4_prefix_cache_new(budget, &pcache, &err) || dsv4_prefix_cache_set_dir(pcache, o.pcache_dir, budget, &err)) {
            rc = cli_fail(CMD, &err);
            goto out;
        }
        dsv4_chat_session_set_prefix_cache(r.s, pcache);
    }
    struct sigaction old;
    install_sigint(&old);
    rc = run(&r, &err) ? cli_fail(CMD, &err) : 0;
    sigaction(SIGINT, &old, NULL);
out:
    if (pcache && o.stats) {
        dsv4_prefix_cache_stats ps;
        dsv4_prefix_cache_get_stats(pcache, &ps);
        fprintf(stderr, "[prefix cache: %lld hit(s), %lld disk hit(s), %lld disk write(s)]\n", (long long)ps.hits,
                (long long)ps.disk_hits, (long long)ps.disk_writes);
    }
    dsv4_chat_session_free(r.s);
    dsv4_prefix_cache_free(pcache);
    if (tok) dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    return rc;
}
