/* One generation request from arrival to its last token, whatever the API: parse and validate the body,
 * tokenize the prompt, check it against the context, make one engine job per choice (n), submit them, and
 * move their tokens into per-choice outputs (server/output.h) as they come. The API layers (api_openai.c,
 * api_anthropic.c) turn a session's state into response bodies or stream events.
 *
 * Runs on the HTTP thread that owns it; only server_session_poll touches the engine (under its lock, briefly).
 * Ownership: the session owns the parsed request, the prompt ids, the jobs' HTTP-side references, the outputs
 * and the token logs; server_session_free cancels whatever is still running. */
#ifndef DSV4_SERVER_SESSION_H
#define DSV4_SERVER_SESSION_H
#include "server/output.h"
#include "server/request.h"
#include "server/server.h"

#define SERVER_MAX_CHOICES 64   /* n per request; the parser's limit is lower (server_parse_limits.max_n) */

typedef enum {
    SERVER_END_NONE = 0,
    SERVER_END_EOS,            /* the model ended its turn */
    SERVER_END_STOP_STRING,    /* a stop string matched (output.stop_index says which) */
    SERVER_END_LENGTH,         /* max_tokens or the context */
    SERVER_END_CANCELLED,      /* the server is shutting down */
    SERVER_END_ERROR,          /* the engine could not run it */
} server_end;

typedef struct {
    server_job *job;
    server_output out;
    int have;                  /* tokens read from the job */
    server_end end;            /* SERVER_END_NONE while running */
    server_token *log;         /* every token read, kept when logprobs or token ids are wanted */
    int n_log, cap_log;
    int log_taken;             /* tokens whose logprobs a stream has already sent */
    int ids_taken;             /* tokens whose ids a stream has already sent */
    /* streaming bookkeeping of the API layers */
    int role_sent, end_sent, calls_sent;
    size_t args_sent;          /* bytes of the arguments of call calls_sent - 1 already sent */
} server_choice;

typedef struct {
    server_ctx *srv;           /* borrowed */
    server_request req;
    int32_t *prompt;           /* owned */
    int n_prompt;
    int max_new;
    server_choice *ch;         /* [req.n] */
    server_waiter waiter;
    int waiter_ok;
    int submitted;
    double t_start, t_first;
    char id[48];
    long created;
    int64_t cached;
    /* streaming state of the API layer */
    int started, finished;
    int block_index, block_kind; /* Anthropic: the open content block (kind 0 none, 1 thinking, 2 text, 3 tool_use) */
    char *echo_text;           /* /v1/completions echo: the prompt as text (owned) */
} server_session;

/* Parse, tokenize, check limits and submit. On error returns the HTTP status with e filled and *out NULL. */
int  server_session_start(server_ctx *srv, server_api api, const char *body, size_t len, server_session **out,
                          server_error *e);
/* Wait up to timeout_ms for progress, then move new tokens into the outputs. Returns 1 when every choice has
 * ended (and its output is finished), else 0. */
int  server_session_poll(server_session *s, int timeout_ms);
/* The client went away or the handler gives up: cancel every job. */
void server_session_cancel(server_session *s);
void server_session_free(server_session *s);

/* Usage: generated tokens over all choices. */
int  server_session_completion_tokens(const server_session *s);
/* An error (SERVER_END_ERROR) ended some choice. */
int  server_session_failed(const server_session *s);
#endif
