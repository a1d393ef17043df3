/* What every HTTP thread of `dsv4 serve` shares: the model's tokenizer, the engine, the limits, the metrics
 * and the options. Built once by cmd_serve before the listener starts, read-only afterwards (the engine and
 * the metrics do their own locking). Passed explicitly to every handler: no global state. */
#ifndef DSV4_SERVER_SERVER_H
#define DSV4_SERVER_SERVER_H
#include "server/engine.h"
#include "server/metrics.h"
#include "server/request.h"
#include "text/tokenizer.h"
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const dsv4_tokenizer *tok;   /* borrowed */
    const dsv4_cvocab *cvocab;   /* borrowed: the vocabulary trie of constrained decoding */
    server_engine *engine;       /* borrowed */
    server_metrics *metrics;     /* borrowed */
    server_parse_limits limits;
    const char *model_name;      /* served model name */
    const char *api_key;         /* NULL: no authentication */
    size_t max_body;             /* bytes; larger bodies get 413 */
    int64_t ctx;                 /* prompt + max_tokens limit */
    int vocab;                   /* the model's */
    int32_t eos_id, user_id;     /* the tokenizer's end-of-turn markers (-1 when absent) */
    int32_t model_eos;           /* the checkpoint's eos_token_id */
    int poll_ms;                 /* how often a waiting HTTP thread checks its client */
    long created;                /* start time, for /v1/models */
    atomic_ullong next_id;       /* request ids and default seeds */
} server_ctx;
#endif
