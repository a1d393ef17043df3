/* Incremental parser for V4 model output: splits generated text into reasoning, content and DSML tool calls,
 * following the official parse_message_from_completion_text rules (spec TOKENIZER_AND_CHAT.md section 2.4):
 *   thinking mode: reasoning runs up to "</think>" (required);
 *   content runs up to EOS or "\n\n<｜DSML｜tool_calls";
 *   tool calls: <｜DSML｜tool_calls>\n, invokes `<｜DSML｜invoke name="N">\n` with parameters
 *   `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>` each followed by "\n", closed by
 *   </｜DSML｜invoke> and </｜DSML｜tool_calls>; only EOS may follow.
 * Arguments are rebuilt as the official code does: {"K": V, ...} joined by ", ", string="true" values
 * JSON-escaped, string="false" values inserted raw (and checked to be valid JSON here).
 *
 * Feed decoded text in pieces of any size (a token, a chunk, everything); reasoning and content are released
 * as soon as they cannot be the start of a marker, and each tool call is reported as soon as its invoke closes.
 * Tool calls also stream: on_call_begin gives the name as soon as the invoke tag is read, then on_arguments
 * gives the arguments' JSON text in pieces as the parameters arrive (a string value byte by byte, escaped, as
 * soon as it cannot be the end tag; other values whole), always cut between UTF-8 characters; their
 * concatenation is exactly the call's arguments when on_tool_call reports it. A call whose text turns out
 * malformed stops its pieces (the parse then fails: a begun call may be left unfinished).
 * Malformed input stops parsing with DSV4_DSML_MALFORMED and a message; ending inside the reasoning or a tool
 * block gives DSV4_DSML_TRUNCATED. The raw text is always kept. The EOS marker may be fed as text or left out
 * (end of generation = dsv4_dsml_finish). */
#ifndef DSV4_TEXT_DSML_H
#define DSV4_TEXT_DSML_H
#include <stddef.h>

typedef enum {
    DSV4_DSML_OK = 0,         /* well-formed so far (after finish: a complete message) */
    DSV4_DSML_MALFORMED = 1,  /* the text breaks the format; see dsv4_dsml_error */
    DSV4_DSML_TRUNCATED = 2,  /* finish() came inside the reasoning or inside a tool-call block */
} dsv4_dsml_status;

typedef struct {
    char *name;       /* owned by the parser */
    char *arguments;  /* JSON object text */
} dsv4_tool_call;

typedef struct {
    void (*on_reasoning)(void *ud, const char *s, size_t n);
    void (*on_content)(void *ud, const char *s, size_t n);
    void (*on_tool_call)(void *ud, const dsv4_tool_call *call);
    void *ud;
    void (*on_call_begin)(void *ud, const char *name);
    void (*on_arguments)(void *ud, const char *s, size_t n);
} dsv4_dsml_callbacks;

typedef struct dsv4_dsml_parser dsv4_dsml_parser;

/* thinking: 1 when the prompt ended with <think> (the output starts with reasoning). cb may be NULL.
 * Returns NULL when out of memory. */
dsv4_dsml_parser *dsv4_dsml_new(int thinking, const dsv4_dsml_callbacks *cb);
void dsv4_dsml_free(dsv4_dsml_parser *p);
/* Feed the next piece of output text. Returns the status so far. */
dsv4_dsml_status dsv4_dsml_feed(dsv4_dsml_parser *p, const char *text, size_t n);
/* End of output. Releases held text and returns the final status. */
dsv4_dsml_status dsv4_dsml_finish(dsv4_dsml_parser *p);

dsv4_dsml_status dsv4_dsml_status_of(const dsv4_dsml_parser *p);
const char *dsv4_dsml_error(const dsv4_dsml_parser *p);               /* "" when none */
const char *dsv4_dsml_reasoning(const dsv4_dsml_parser *p, size_t *n);
const char *dsv4_dsml_content(const dsv4_dsml_parser *p, size_t *n);
const char *dsv4_dsml_raw(const dsv4_dsml_parser *p, size_t *n);      /* everything fed */
int dsv4_dsml_n_calls(const dsv4_dsml_parser *p);
const dsv4_tool_call *dsv4_dsml_call(const dsv4_dsml_parser *p, int i);
int dsv4_dsml_saw_eos(const dsv4_dsml_parser *p);
#endif
