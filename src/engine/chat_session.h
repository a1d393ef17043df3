/* A multi-turn V4 chat on ONE sequence: the conversation (OpenAI-shaped messages), the sequence that holds its
 * tokens, and incremental rendering, so each turn feeds only the tokens it adds (nothing is re-prefilled).
 *
 * Turn protocol:
 *   dsv4_chat_session_user(s, text)    render + feed the new user turn; the assistant turn is now open
 *   dsv4_chat_session_next(s, ...)     sample one reply token and feed it (repeat until *done)
 *     or dsv4_chat_session_feed_reply  commit given reply tokens instead of sampling (tests, replays)
 *   dsv4_chat_session_close(s)         close the assistant turn and record it in the conversation
 *
 * Multi-turn rules (spec TOKENIZER_AND_CHAT.md 2.2) and what this session does with them:
 *   - Earlier reasoning is KEPT in context. The official encoder drops reasoning_content of assistants before
 *     the last user message in thinking mode (without tools); doing that here would change tokens that are
 *     already in the sequence, so every later turn would need a re-prefill from the first reply. Instead the
 *     whole conversation is rendered with drop_thinking = false, which keeps `reasoning</think>` in every
 *     assistant turn and `<think>` in every thinking transition: the official rendering of exactly what the
 *     sequence holds (the same choice as ds4's REPL). Consequence: position after turn k == token count of
 *     dsv4_chat_session_render_full() (drop_thinking = false), and those tokens are identical.
 *   - Each turn's new text is the official rendering of the conversation with the new user message minus the
 *     official rendering without it (checked to be a prefix). The suffix starts with <｜User｜>, an added token,
 *     so encoding it alone gives the same ids as encoding the whole text.
 *   - /think and /nothink switch the mode for following turns only. The official encoder has one mode per
 *     conversation, so a conversation that mixes modes has no single official rendering; here each turn stays
 *     as it was rendered in its own mode (the new suffix is the official one for the current mode).
 *   - Reply tokens are the model's own samples. When the model picks a non-canonical tokenization (e.g. "a","a"
 *     where BPE would merge "aa"), re-encoding the reply's text gives other ids; the sequence keeps the sampled
 *     ids (what the model actually conditioned on), so render_full equality is a property of canonical replies.
 *
 * Closing a turn (EOS sampled, token limit, or an interrupt): the reply tokens fed so far stay committed; then
 * "</think>" is fed when a thinking reply never closed its reasoning, and EOS is fed, so the sequence ends exactly
 * as the official rendering of the recorded assistant message {reasoning_content, content} does.
 *
 * Ownership: the session borrows the model and the tokenizer (they must outlive it) and owns its sequence,
 * sampler, conversation and the per-turn parser. Not thread-safe. */
#ifndef DSV4_ENGINE_CHAT_SESSION_H
#define DSV4_ENGINE_CHAT_SESSION_H
#include "dsv4.h"
#include "engine/sampler.h"
#include "text/dsml.h"
#include "text/tokenizer.h"
#include <jansson.h>
#include <stdint.h>

typedef struct dsv4_chat_session dsv4_chat_session;

typedef struct {
    const char  *system;        /* NULL or "": no system message */
    int          thinking;      /* mode of the first turn */
    dsv4_sampling sampling;
    /* Display of the reply as it streams, split by the DSML parser (all may be NULL). on_raw receives text the
     * parser could not classify (after malformed DSML), so nothing generated is ever hidden. */
    dsv4_dsml_callbacks show;
    void (*on_raw)(void *ud, const char *s, size_t n);
} dsv4_chat_session_opts;

int  dsv4_chat_session_new(dsv4_model *m, const dsv4_tokenizer *t, const dsv4_chat_session_opts *o,
                           dsv4_chat_session **out, dsv4_error *err);
void dsv4_chat_session_free(dsv4_chat_session *s);
/* Reuse and store sequence states through a prefix cache (borrowed; NULL = none). */
void dsv4_chat_session_set_prefix_cache(dsv4_chat_session *s, dsv4_prefix_cache *c);

/* Mode for the following turns (not the open one). */
void dsv4_chat_session_set_thinking(dsv4_chat_session *s, int thinking);
int  dsv4_chat_session_thinking(const dsv4_chat_session *s);
/* Fresh sequence and an empty conversation (the system text stays). Closes nothing: call after close. */
int  dsv4_chat_session_reset(dsv4_chat_session *s, dsv4_error *err);

/* Start a turn: render and feed `<｜User｜>text<｜Assistant｜><think>|</think>` (with BOS + system first on a fresh
 * conversation). Fails with DSV4_E_STATE when a turn is open. On error nothing is committed. */
int  dsv4_chat_session_user(dsv4_chat_session *s, const char *text, dsv4_error *err);
/* Sample the next reply token and feed it. *done = 1 (and *tok = the stop token, not fed) when the model ended
 * its turn (EOS, or <｜User｜>, which would start a turn the model may not write). */
int  dsv4_chat_session_next(dsv4_chat_session *s, int32_t *tok, int *done, dsv4_error *err);
/* Commit given reply tokens (no sampling), as if the model had produced them. Must not contain stop tokens. */
int  dsv4_chat_session_feed_reply(dsv4_chat_session *s, const int32_t *toks, int n, dsv4_error *err);
/* Close the open turn (see the header comment) and append the assistant message to the conversation. */
int  dsv4_chat_session_close(dsv4_chat_session *s, dsv4_error *err);

int            dsv4_chat_session_turn_open(const dsv4_chat_session *s);
int            dsv4_chat_session_reply_len(const dsv4_chat_session *s);   /* tokens of the open reply */
int64_t        dsv4_chat_session_position(const dsv4_chat_session *s);
const int32_t *dsv4_chat_session_tokens(const dsv4_chat_session *s);
const json_t  *dsv4_chat_session_messages(const dsv4_chat_session *s);    /* borrowed */
/* The official rendering of the whole conversation (messages so far, drop_thinking = false, mode of the last
 * turn). Heap string the caller frees. */
int  dsv4_chat_session_render_full(const dsv4_chat_session *s, char **out, size_t *len, dsv4_error *err);
#endif
