/* One choice's output as text: generated token ids -> UTF-8 (streaming detokenizer) -> for chat, the DSML
 * parser's split into reasoning, content and tool calls -> stop strings over the content. The API layers take
 * the new reasoning / content / tool calls since their last look (deltas) and the totals at the end.
 *
 * Stop strings: content that could still be the start of a stop string is held back; when one matches, the
 * content ends right before it and server_output_push returns 1 (the caller cancels the job). Reasoning is
 * not searched (a stop string ends the answer, not the thinking).
 * Malformed DSML (the model broke the tool-call format): the text the parser had not released and everything
 * after it becomes content, so nothing generated is hidden.
 * End-of-turn tokens (EOS, <｜User｜>) are not text: they are skipped.
 * Tool calls stream: a call is announced (n_begun) as soon as the parser reads its name, and its arguments grow
 * piece by piece (whole UTF-8 characters); calls[] holds the finished ones. Malformed DSML after a call was
 * announced leaves it unfinished (never in calls[]).
 *
 * Ownership: borrows the tokenizer and the stop strings (they must outlive it); owns its buffers. */
#ifndef DSV4_SERVER_OUTPUT_H
#define DSV4_SERVER_OUTPUT_H
#include "text/dsml.h"
#include "text/strbuf.h"
#include "text/tokenizer.h"
#include <stdint.h>

typedef struct {
    char *name, *arguments;      /* owned */
} server_call;

typedef struct {
    const dsv4_tokenizer *tok;
    dsv4_detokenizer detok;
    dsv4_strbuf piece;           /* scratch for the detokenizer */
    dsv4_dsml_parser *dsml;      /* chat only; NULL: all text is content */
    int raw_mode;                /* the DSML parser gave up */
    size_t seen_reasoning, seen_content;   /* what the parser released, for the raw fallback */
    int thinking;
    char *const *stop;           /* borrowed */
    int n_stop;
    dsv4_strbuf held;            /* content not yet released (could start a stop string) */
    int stopped;                 /* a stop string matched */
    int stop_index;              /* which one (-1: none) */
    int32_t skip[4];
    int n_skip;
    /* totals and the cursors of what the API layer has taken */
    dsv4_strbuf reasoning, content;
    size_t taken_reasoning, taken_content;
    server_call *calls;          /* finished calls */
    int n_calls, cap_calls, taken_calls;
    int n_begun;                 /* calls announced (finished, plus one in progress when n_begun > n_calls) */
    char *cur_name;              /* the call in progress: its name and its arguments so far */
    dsv4_strbuf cur_args;
    int n_tokens;                /* ids pushed */
} server_output;

/* chat: run the DSML parser (thinking: the output starts with reasoning). */
int  server_output_init(server_output *o, const dsv4_tokenizer *t, int chat, int thinking, char *const *stop, int n_stop,
                        const int32_t *skip_ids, int n_skip);
void server_output_free(server_output *o);
/* Add one generated token. Returns 1 when a stop string matched (ignore further tokens), else 0. */
int  server_output_push(server_output *o, int32_t id);
/* End of generation: release everything held. */
void server_output_finish(server_output *o);
/* New text since the last call (pointers into the totals; n may be 0). */
const char *server_output_new_reasoning(server_output *o, size_t *n);
const char *server_output_new_content(server_output *o, size_t *n);
/* Call k < n_begun: its name and its arguments so far (all of them once finished, which it returns 1 for). */
int server_output_call(const server_output *o, int k, const char **name, const char **args, size_t *n_args);

/* Valid UTF-8 copy of bytes (ill-formed sequences become U+FFFD) as a JSON string; never NULL unless oom. */
struct json_t;
struct json_t *server_json_text(const char *s, size_t n);
#endif
