/* Request parsing and validation for `dsv4 serve`: an HTTP body of one of the three APIs becomes a
 * server_request — the prompt text (the V4 chat encoding of the conversation, or the raw completion prompt),
 * or prompt token ids, and every generation parameter, checked. Pure: no engine, no tokenizer, no I/O, no
 * global state; every failure is a server_error with the HTTP status, the error type and the field that is
 * wrong. This is the fuzz entry point (server_parse_request over arbitrary bytes must never crash).
 *
 * What the APIs map to:
 *   /v1/chat/completions (OpenAI): messages (system, developer, user, assistant, tool), tools + tool_choice
 *     (auto, none), reasoning_effort / thinking -> V4 chat or thinking mode and effort, sampling, stop, n,
 *     penalties, logprobs + top_logprobs, stream + stream_options.include_usage;
 *   /v1/completions (OpenAI legacy): prompt text or token ids, echo, logprobs (an integer), the same sampling;
 *   /v1/messages (Anthropic): system, content blocks (text, tool_use, tool_result, thinking), tools,
 *     tool_choice (auto, none), thinking, max_tokens (required), stop_sequences, stream, output_config.format
 *     (structured outputs; the beta's output_format too).
 * tool_choice required / named (and auto with strict tools) and response_format need constrained decoding: they go
 * through constraint_hook.h (the JSON Schema grammar, the DSML tool-call grammar). */
#ifndef DSV4_SERVER_REQUEST_H
#define DSV4_SERVER_REQUEST_H
#include "engine/sampler.h"
#include <stddef.h>
#include <stdint.h>

typedef enum {
    SERVER_API_CHAT = 0,         /* POST /v1/chat/completions */
    SERVER_API_COMPLETIONS = 1,  /* POST /v1/completions */
    SERVER_API_MESSAGES = 2,     /* POST /v1/messages */
} server_api;

/* An error for the client: HTTP status, the API's error type, the offending field ("" when none). */
typedef struct {
    int  status;
    char type[48];
    char param[128];
    char message[512];
} server_error;

/* Sets e and returns e->status (so `return server_fail(...)` reads as an error return). */
int server_fail(server_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* What the parser accepts: limits come from the command line. */
typedef struct {
    int max_n;                   /* choices per request (n) */
    int max_stop;                /* stop strings */
    int max_top_logprobs;
    const char *served_model;    /* the model name clients must use ("" or NULL: any) */
    int encoder_0731;            /* the checkpoint uses the V4-Flash-0731 chat encoder */
} server_parse_limits;

typedef struct {
    server_api api;
    char *prompt_text;           /* rendered prompt (chat, messages) or completion prompt text; NULL with ids */
    int32_t *prompt_ids;         /* /v1/completions with token ids (owned); NULL otherwise */
    int n_prompt_ids;
    int thinking;                /* the prompt ends inside an open <think>: output starts with reasoning */
    int parse_tools;             /* tools were offered: parse DSML tool calls out of the output */
    int stream, include_usage;
    int n;                       /* choices */
    long long max_tokens;        /* -1: not given (the server uses what the context leaves) */
    dsv4_sampling sampling;
    int seed_given;
    float presence_penalty, frequency_penalty;
    int logprobs;                /* report the sampled tokens' log-probabilities */
    int top_logprobs;            /* alternatives per token (0..max) */
    int echo;                    /* /v1/completions: the prompt is part of the returned text */
    int return_token_ids;        /* vLLM's extension: prompt_token_ids and each choice's token_ids */
    int ignore_eos;              /* vLLM's extension: generate max_tokens, end-of-turn tokens do not stop */
    char **stop;                 /* n_stop non-empty strings, owned */
    int n_stop;
    char *model;                 /* the name the client asked for (owned; NULL when absent) */
    struct json_t *response_format; /* json_object / json_schema to enforce (owned reference; NULL: none), in the
                                     * client's shape: rf_kind says which (constraint_hook.h) */
    int rf_kind;                 /* server_constraint_kind */
    const char *rf_param;        /* static: the field it came in ("response_format", "output_config.format") */
    int tool_mode;               /* -1: no tool constraint; else dsv4_tools_mode (engine/tool_grammar.h) */
    char *tool_name;             /* DSV4_TOOLS_NAMED: the function (owned) */
    struct json_t *tools;        /* with a tool constraint: the tools in OpenAI form (owned reference) */
} server_request;

/* Parse and validate body[0..len) for `api`. On success *out owns everything (server_request_free); on
 * failure *out is empty and e says why (4xx). */
int  server_parse_request(server_api api, const char *body, size_t len, const server_parse_limits *lim,
                          server_request *out, server_error *e);
void server_request_free(server_request *r);
#endif
