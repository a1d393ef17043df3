/* DeepSeek V4 tokenizer: a Hugging Face tokenizer.json (byte-level BPE) loaded into an object the caller owns.
 *
 * Encoding = (1) cut the text at added/special tokens (leftmost, longest match, like HF's added-vocabulary
 * automaton), (2) run the pre-tokenizer's chained Split regexes on each text span (PCRE2), (3) byte-level BPE on
 * each piece. No BOS is added unless asked: V4's tokenizer_config says add_bos_token=false and the chat encoding
 * writes BOS as text; dsv4_tokenizer_add_bos() reports what the config says.
 *
 * Decoding maps ids back to bytes (added tokens literally, vocabulary tokens through the inverse GPT-2 byte map)
 * and assembles UTF-8 incrementally, so a character split across tokens is held until complete and ill-formed
 * bytes become U+FFFD.
 *
 * A loaded tokenizer is read-only: encode/decode may run concurrently on one object from several threads. */
#ifndef DSV4_TEXT_TOKENIZER_H
#define DSV4_TEXT_TOKENIZER_H
#include "dsv4.h"
#include "text/strbuf.h"
#include "text/utf8.h"
#include <stddef.h>
#include <stdint.h>

typedef struct dsv4_tokenizer dsv4_tokenizer;

/* Load tokenizer.json; config_path (tokenizer_config.json) may be NULL. */
int  dsv4_tokenizer_load(const char *json_path, const char *config_path, dsv4_tokenizer **out, dsv4_error *err);
/* The same from memory: the text of tokenizer.json and, when config_json is not NULL, of tokenizer_config.json
 * (neither needs a terminating NUL). Messages name them "tokenizer.json" / "tokenizer_config.json". */
int  dsv4_tokenizer_load_mem(const char *json, size_t len, const char *config_json, size_t config_len,
                             dsv4_tokenizer **out, dsv4_error *err);
/* Load DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (a checkpoint folder). */
int  dsv4_tokenizer_load_dir(const char *dir, dsv4_tokenizer **out, dsv4_error *err);
/* Same as dsv4_tokenizer_load, plus the config next to json_path when one exists. */
int  dsv4_tokenizer_load_file(const char *json_path, dsv4_tokenizer **out, dsv4_error *err);
void dsv4_tokenizer_free(dsv4_tokenizer *t);

enum {
    DSV4_ENCODE_PLAIN   = 1 << 0, /* do not match added/special tokens: all text is BPE text (untrusted input) */
    DSV4_ENCODE_ADD_BOS = 1 << 1, /* prepend the BOS id */
};

/* Encode n bytes of UTF-8 text. *ids is a heap array the caller frees (non-NULL even when *n_ids == 0).
 * Fails with DSV4_E_ARG on ill-formed UTF-8 (the message gives the byte offset). */
int dsv4_tokenizer_encode(const dsv4_tokenizer *t, const char *text, size_t n, int flags, int32_t **ids,
                          size_t *n_ids, dsv4_error *err);

/* Decode ids into a NUL-terminated heap string (valid UTF-8; U+FFFD replaces ill-formed bytes).
 * Fails with DSV4_E_ARG on an id outside the vocabulary. */
int dsv4_tokenizer_decode(const dsv4_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *out_len,
                          dsv4_error *err);

/* Streaming decoder: push ids one at a time as they are generated; text becomes available as soon as it
 * forms complete characters. */
typedef struct {
    const dsv4_tokenizer *tok;
    dsv4_utf8_stream      utf8;
} dsv4_detokenizer;

void dsv4_detokenizer_init(dsv4_detokenizer *d, const dsv4_tokenizer *t);
/* Append the newly completed text for id to out. */
int  dsv4_detokenizer_push(dsv4_detokenizer *d, int32_t id, dsv4_strbuf *out, dsv4_error *err);
/* End of stream: a held incomplete character becomes U+FFFD. */
void dsv4_detokenizer_finish(dsv4_detokenizer *d, dsv4_strbuf *out);

/* Id of a token given its text: added tokens by content, vocabulary tokens by their byte-level string. -1 if none. */
int32_t dsv4_tokenizer_token_id(const dsv4_tokenizer *t, const char *s);
/* Raw bytes id decodes to (not NUL-terminated), or NULL for an unknown id. */
const char *dsv4_tokenizer_token_bytes(const dsv4_tokenizer *t, int32_t id, size_t *len);
int32_t dsv4_tokenizer_vocab_size(const dsv4_tokenizer *t);   /* highest id + 1 */
/* 1 when id is an added token (special tokens, <think>, DSML markers): never plain text to a constraint. */
int     dsv4_tokenizer_is_added(const dsv4_tokenizer *t, int32_t id);
int     dsv4_tokenizer_n_merges(const dsv4_tokenizer *t);
int     dsv4_tokenizer_n_added(const dsv4_tokenizer *t);
int     dsv4_tokenizer_add_bos(const dsv4_tokenizer *t);      /* tokenizer_config add_bos_token */
int32_t dsv4_tokenizer_bos_id(const dsv4_tokenizer *t);       /* -1 when unknown */
int32_t dsv4_tokenizer_eos_id(const dsv4_tokenizer *t);

/* Encode throughput in MB/s (1e6 bytes/s) over `text`, best of `repeats` runs, each run encoding the text
 * line by line (added tokens matched). For `dsv4 bench --tokenizer`. Returns < 0 on error (err filled). */
double dsv4_tokenizer_bench_mbps(const dsv4_tokenizer *t, const char *text, size_t n, int repeats,
                                 dsv4_error *err);
/* A deterministic mixed-language benchmark corpus of about `bytes` bytes (English, code, CJK, kana, Korean,
 * Arabic, Devanagari, emoji, digits, whitespace). Heap string; NULL when out of memory. */
char *dsv4_tokenizer_bench_corpus(size_t bytes, size_t *len);
#endif
