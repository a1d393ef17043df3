/* Multi-turn chat on one sequence; the rules are in chat_session.h. */
#include "engine/chat_session.h"
#include "text/chat.h"
#include "text/strbuf.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

struct dsv4_chat_session {
    dsv4_model *model;                 /* borrowed */
    const dsv4_tokenizer *tok;         /* borrowed */
    dsv4_seq *seq;                     /* owned */
    dsv4_prefix_cache *pcache;         /* borrowed, optional: states reused across sessions and processes */
    dsv4_sampler sampler;              /* owned; its n_allowed keeps ids the tokenizer cannot decode out */
    int32_t drawn;                     /* the next reply token while a turn is open (drawn by the last feed) */
    int vocab, tok_vocab;
    int32_t eos_id, user_id;
    char *system;                      /* owned copy, NULL when none */
    int thinking;                      /* mode of the next turn */
    json_t *messages;                  /* owned: the conversation, every closed turn included */

    /* the open turn */
    int turn_open, turn_thinking;
    int last_thinking;                 /* mode of the most recent turn (render_full) */
    int32_t *reply;                    /* reply tokens fed so far */
    int reply_len, reply_cap;
    dsv4_detokenizer detok;
    dsv4_strbuf piece;                 /* scratch for the streaming detokenizer */
    dsv4_dsml_parser *parser;          /* display split of this reply */
    size_t shown_reasoning, shown_content;
    int raw_mode;                      /* the parser gave up: stream text unparsed */
    dsv4_chat_session_opts opts;       /* callbacks (system pointer not used after new) */
};

/* ---- display: the DSML parser's callbacks, counted so a malformed tail can be shown raw ----------------- */

static void shown_reasoning(void *ud, const char *p, size_t n) {
    dsv4_chat_session *s = ud;
    s->shown_reasoning += n;
    if (s->opts.show.on_reasoning) s->opts.show.on_reasoning(s->opts.show.ud, p, n);
}

static void shown_content(void *ud, const char *p, size_t n) {
    dsv4_chat_session *s = ud;
    s->shown_content += n;
    if (s->opts.show.on_content) s->opts.show.on_content(s->opts.show.ud, p, n);
}

static void shown_call(void *ud, const dsv4_tool_call *c) {
    dsv4_chat_session *s = ud;
    if (s->opts.show.on_tool_call) s->opts.show.on_tool_call(s->opts.show.ud, c);
}

static void show_raw(dsv4_chat_session *s, const char *p, size_t n) {
    if (n && s->opts.on_raw) s->opts.on_raw(s->opts.show.ud, p, n);
}

/* When the parser stops on malformed DSML, everything it had not released yet is shown raw, and so is the
 * rest of the reply: a display never hides generated text. */
static void switch_to_raw(dsv4_chat_session *s) {
    size_t n_raw;
    const char *raw = dsv4_dsml_raw(s->parser, &n_raw);
    size_t off = s->shown_reasoning;
    if (s->turn_thinking && off + strlen(DSV4_THINK_END_TEXT) <= n_raw &&
        !memcmp(raw + off, DSV4_THINK_END_TEXT, strlen(DSV4_THINK_END_TEXT)))
        off += strlen(DSV4_THINK_END_TEXT);
    off += s->shown_content;
    if (off < n_raw) show_raw(s, raw + off, n_raw - off);
    s->raw_mode = 1;
}

static void show_text(dsv4_chat_session *s, const char *p, size_t n) {
    if (!n) return;
    if (s->raw_mode) { show_raw(s, p, n); return; }
    if (dsv4_dsml_feed(s->parser, p, n) == DSV4_DSML_MALFORMED) switch_to_raw(s);
}

/* ---- sequence feeding -------------------------------------------------------------------------------- */

/* With a prefix cache, the longest stored state of (history + ids) replaces the sequence first, so only the
 * rest is processed (at least one token when the next token is drawn), and the state after a multi-token feed (a
 * user turn, a closing) is stored; single generated tokens go straight through. A state is exact at any
 * position, so the conversation is the same with or without the cache. */
static int reuse_cached(dsv4_chat_session *s, const int32_t *ids, int n, int draw, int *skip, dsv4_error *err) {
    *skip = 0;
    const int64_t pos = dsv4_seq_position(s->seq), total = pos + n;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)total);
    if (!all) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (pos) memcpy(all, dsv4_seq_tokens(s->seq), sizeof(int32_t) * (size_t)pos);
    memcpy(all + pos, ids, sizeof(int32_t) * (size_t)n);
    dsv4_seq *cand = NULL;
    int64_t matched = 0;
    int rc = dsv4_prefix_cache_lookup(s->pcache, s->model, all, draw ? total - 1 : total, &cand, &matched, err);
    free(all);
    if (rc) return rc;
    if (matched > pos) {
        dsv4_seq_free(s->seq);
        s->seq = cand;
        *skip = (int)(matched - pos);
    } else {
        dsv4_seq_free(cand);
    }
    return 0;
}

/* The step item that takes the last fed token draws the next reply token: draw number sampler.counter (which
 * dsv4_chat_session_next advances when it takes the token), on the model's device; only the id comes back. */
static void draw_next(dsv4_chat_session *s, dsv4_step_item *it) {
    it->sample = &s->sampler.params;
    it->draw = s->sampler.counter;
    it->token = &s->drawn;
}

/* Feed ids; with draw, the step also draws the next reply token into s->drawn. */
static int feed(dsv4_chat_session *s, const int32_t *ids, int n, int draw, dsv4_error *err) {
    if (n == 0) return 0;
    int skip = 0, rc;
    const int cached = s->pcache && n > 1;
    if (cached && (rc = reuse_cached(s, ids, n, draw, &skip, err))) return rc;
    /* with a draw the state is stored one token short — the longest a later lookup for the same feed may use —
     * and the last token then goes on its own (chunking never changes a result) */
    const int last = cached && draw ? 1 : 0;
    if (skip < n - last) {
        dsv4_step_item it = { s->seq, ids + skip, n - last - skip, DSV4_LOGITS_NONE, NULL };
        if (draw && !last) draw_next(s, &it);
        if ((rc = dsv4_step(s->model, &it, 1, err))) return rc;
    }
    if (cached && (rc = dsv4_prefix_cache_put(s->pcache, s->seq, err))) return rc;
    if (last) {
        dsv4_step_item it = { s->seq, ids + n - 1, 1, DSV4_LOGITS_NONE, NULL };
        draw_next(s, &it);
        if ((rc = dsv4_step(s->model, &it, 1, err))) return rc;
    }
    return 0;
}

void dsv4_chat_session_set_prefix_cache(dsv4_chat_session *s, dsv4_prefix_cache *c) { s->pcache = c; }

static int encode(const dsv4_chat_session *s, const char *text, size_t n, int32_t **ids, size_t *n_ids,
                  dsv4_error *err) {
    return dsv4_tokenizer_encode(s->tok, text, n, 0, ids, n_ids, err);
}

/* ---- conversation rendering --------------------------------------------------------------------------- */

static int render(const json_t *messages, int thinking, char **out, size_t *len, dsv4_error *err) {
    dsv4_chat_opts o;
    dsv4_chat_opts_default(&o);
    o.thinking = thinking;
    o.drop_thinking = 0;   /* keep earlier reasoning: it is in the sequence (see the header) */
    return dsv4_chat_render(messages, &o, out, len, err);
}

static json_t *text_message(const char *role, const char *content) {
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* A fresh conversation: the system message, when there is one. */
static int conversation_start(dsv4_chat_session *s, dsv4_error *err) {
    json_decref(s->messages);
    s->messages = json_array();
    if (!s->messages) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (s->system && *s->system && json_array_append_new(s->messages, text_message("system", s->system)))
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    return 0;
}

/* The text the new user message adds: render(with) minus render(without). An empty conversation renders to
 * "" so the first turn gets BOS + system + user + transition. */
static int user_turn_text(dsv4_chat_session *s, json_t *with, char **out, size_t *len, dsv4_error *err) {
    char *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    int rc = 0;
    int fresh = dsv4_seq_position(s->seq) == 0;   /* nothing fed yet: BOS and the system text come too */
    if (!fresh && (rc = render(s->messages, s->thinking, &before, &nb, err))) goto out;
    if ((rc = render(with, s->thinking, &after, &na, err))) goto out;
    if (fresh) nb = 0;
    if (na < nb || (nb && memcmp(before, after, nb))) {
        rc = dsv4_fail(err, DSV4_E_STATE, "chat: the rendered conversation does not extend the previous one");
        goto out;
    }
    *len = na - nb;
    *out = malloc(*len + 1);
    if (!*out) { rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); goto out; }
    memcpy(*out, after + nb, *len);
    (*out)[*len] = 0;
out:
    free(before);
    free(after);
    return rc;
}

/* ---- lifecycle ----------------------------------------------------------------------------------------- */

/* The chat format needs its markers to be single added tokens, or prompts would be mere text to the model. */
static int check_chat_tokens(const dsv4_tokenizer *t, dsv4_error *err) {
    const char *need[] = { DSV4_BOS_TEXT, DSV4_EOS_TEXT, DSV4_USER_TEXT, DSV4_ASSISTANT_TEXT, DSV4_THINK_TEXT,
                           DSV4_THINK_END_TEXT };
    for (size_t i = 0; i < sizeof need / sizeof *need; i++)
        if (dsv4_tokenizer_token_id(t, need[i]) < 0)
            return dsv4_fail(err, DSV4_E_ARG, "the tokenizer has no %s token: it cannot encode V4 chats", need[i]);
    return 0;
}

int dsv4_chat_session_new(dsv4_model *m, const dsv4_tokenizer *t, const dsv4_chat_session_opts *o,
                          dsv4_chat_session **out, dsv4_error *err) {
    *out = NULL;
    if (check_chat_tokens(t, err)) return err->code;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    if (dsv4_tokenizer_vocab_size(t) > info.vocab_size)
        return dsv4_fail(err, DSV4_E_ARG, "the tokenizer has %d ids but the model only %d",
                         dsv4_tokenizer_vocab_size(t), info.vocab_size);
    dsv4_chat_session *s = calloc(1, sizeof *s);
    if (!s) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    s->model = m;
    s->tok = t;
    s->opts = *o;
    s->opts.system = NULL;
    s->vocab = info.vocab_size;
    s->tok_vocab = dsv4_tokenizer_vocab_size(t);
    s->eos_id = dsv4_tokenizer_token_id(t, DSV4_EOS_TEXT);
    s->user_id = dsv4_tokenizer_token_id(t, DSV4_USER_TEXT);
    s->thinking = s->last_thinking = !!o->thinking;
    dsv4_sb_init(&s->piece);
    int rc = 0;
    if (o->system && !(s->system = strdup(o->system))) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    dsv4_sampling sp = o->sampling;
    /* ids the tokenizer cannot decode (model vocab rows past the tokenizer's last id) are never drawn */
    if (sp.n_allowed <= 0 || sp.n_allowed > s->tok_vocab) sp.n_allowed = s->tok_vocab;
    if (!rc) rc = dsv4_sampler_init(&s->sampler, &sp, s->vocab, err);
    if (!rc) rc = dsv4_seq_new(m, &s->seq, err);
    if (!rc) rc = conversation_start(s, err);
    if (rc) { dsv4_chat_session_free(s); return rc; }
    *out = s;
    return 0;
}

static void turn_free(dsv4_chat_session *s) {
    dsv4_dsml_free(s->parser);
    s->parser = NULL;
    free(s->reply);
    s->reply = NULL;
    s->reply_len = s->reply_cap = 0;
    s->turn_open = 0;
}

void dsv4_chat_session_free(dsv4_chat_session *s) {
    if (!s) return;
    turn_free(s);
    dsv4_sb_free(&s->piece);
    json_decref(s->messages);
    dsv4_seq_free(s->seq);
    dsv4_sampler_free(&s->sampler);
    free(s->system);
    free(s);
}

void dsv4_chat_session_set_thinking(dsv4_chat_session *s, int thinking) { s->thinking = !!thinking; }
int  dsv4_chat_session_thinking(const dsv4_chat_session *s) { return s->thinking; }

int dsv4_chat_session_reset(dsv4_chat_session *s, dsv4_error *err) {
    dsv4_seq *fresh = NULL;
    if (dsv4_seq_new(s->model, &fresh, err)) return err->code;   /* old state kept on failure */
    turn_free(s);
    dsv4_seq_free(s->seq);
    s->seq = fresh;
    return conversation_start(s, err);
}

/* ---- a turn -------------------------------------------------------------------------------------------- */

static int turn_begin(dsv4_chat_session *s, dsv4_error *err) {
    s->turn_thinking = s->last_thinking = s->thinking;
    s->shown_reasoning = s->shown_content = 0;
    s->raw_mode = 0;
    dsv4_dsml_callbacks cb = { shown_reasoning, shown_content, shown_call, s };
    if (!(s->parser = dsv4_dsml_new(s->turn_thinking, &cb))) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    dsv4_detokenizer_init(&s->detok, s->tok);
    s->turn_open = 1;
    return 0;
}

int dsv4_chat_session_user(dsv4_chat_session *s, const char *text, dsv4_error *err) {
    if (s->turn_open) return dsv4_fail(err, DSV4_E_STATE, "chat: the previous reply is still open");
    json_t *with = json_copy(s->messages);   /* shallow: the new message only is added */
    if (!with || json_array_append_new(with, text_message("user", text))) {
        json_decref(with);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    char *add = NULL;
    size_t n_add = 0, n_ids = 0;
    int32_t *ids = NULL;
    int rc = user_turn_text(s, with, &add, &n_add, err);
    if (!rc) rc = encode(s, add, n_add, &ids, &n_ids, err);
    if (!rc) rc = turn_begin(s, err);
    if (!rc && (rc = feed(s, ids, (int)n_ids, 1, err))) turn_free(s);   /* step: no change on error */
    if (!rc) {
        json_decref(s->messages);
        s->messages = with;
        with = NULL;
    }
    json_decref(with);
    free(add);
    free(ids);
    return rc;
}

static int reply_push(dsv4_chat_session *s, int32_t id, dsv4_error *err) {
    if (s->reply_len == s->reply_cap) {
        int cap = s->reply_cap ? 2 * s->reply_cap : 256;
        int32_t *r = realloc(s->reply, sizeof *r * (size_t)cap);
        if (!r) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        s->reply = r;
        s->reply_cap = cap;
    }
    s->reply[s->reply_len++] = id;
    return 0;
}

/* Feed one reply token (drawing the next one), record it and show its text. */
static int commit_reply_token(dsv4_chat_session *s, int32_t id, dsv4_error *err) {
    if (reply_push(s, id, err)) return err->code;
    if (feed(s, &id, 1, 1, err)) { s->reply_len--; return err->code; }
    dsv4_sb_clear(&s->piece);
    if (dsv4_detokenizer_push(&s->detok, id, &s->piece, err)) return err->code;
    show_text(s, s->piece.data, s->piece.len);
    return 0;
}

int dsv4_chat_session_next(dsv4_chat_session *s, int32_t *tok, int *done, dsv4_error *err) {
    *done = 0;
    if (!s->turn_open) return dsv4_fail(err, DSV4_E_STATE, "chat: no reply is open");
    const int32_t id = s->drawn;
    s->sampler.counter++;
    *tok = id;
    if (id == s->eos_id || id == s->user_id) { *done = 1; return 0; }
    return commit_reply_token(s, id, err);
}

int dsv4_chat_session_feed_reply(dsv4_chat_session *s, const int32_t *toks, int n, dsv4_error *err) {
    if (!s->turn_open) return dsv4_fail(err, DSV4_E_STATE, "chat: no reply is open");
    for (int i = 0; i < n; i++) {
        if (toks[i] < 0 || toks[i] >= s->tok_vocab || toks[i] == s->eos_id || toks[i] == s->user_id)
            return dsv4_fail(err, DSV4_E_ARG, "chat: reply token %d is not a reply token", toks[i]);
        if (commit_reply_token(s, toks[i], err)) return err->code;
    }
    return 0;
}

/* The assistant message for the reply text: in a thinking turn, reasoning is the text before the first
 * "</think>" and content the rest; a reasoning that never closed is all reasoning (close() feeds "</think>"). */
static json_t *assistant_message(int thinking, const char *text, int *reasoning_open) {
    *reasoning_open = 0;
    if (!thinking) return text_message("assistant", text);
    const char *end = strstr(text, DSV4_THINK_END_TEXT);
    if (!end) {
        *reasoning_open = 1;
        return json_pack("{s:s, s:s, s:s}", "role", "assistant", "reasoning_content", text, "content", "");
    }
    json_t *m = json_pack("{s:s, s:s%, s:s}", "role", "assistant", "reasoning_content", text, (size_t)(end - text),
                          "content", end + strlen(DSV4_THINK_END_TEXT));
    return m;
}

/* Close the turn. Why this way: the tokens already fed cannot be taken back (the sequence is append-only and
 * exact), so the turn is completed rather than undone: "</think>" when a thinking reply is still inside its
 * reasoning, then EOS, which is exactly how the official encoder renders the recorded message
 * {reasoning_content, content}. The next user turn then extends a well-formed conversation. */
int dsv4_chat_session_close(dsv4_chat_session *s, dsv4_error *err) {
    if (!s->turn_open) return dsv4_fail(err, DSV4_E_STATE, "chat: no reply is open");
    char *text = NULL;
    size_t n_text = 0, n_tail = 0;
    int32_t *tail = NULL;
    json_t *msg = NULL;
    int reasoning_open = 0, rc = dsv4_tokenizer_decode(s->tok, s->reply, (size_t)s->reply_len, &text, &n_text, err);
    if (!rc && !(msg = assistant_message(s->turn_thinking, text, &reasoning_open)))
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    dsv4_strbuf closing;
    dsv4_sb_init(&closing);
    if (reasoning_open) dsv4_sb_puts(&closing, DSV4_THINK_END_TEXT);
    dsv4_sb_puts(&closing, DSV4_EOS_TEXT);
    if (!rc && closing.oom) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (!rc) rc = encode(s, closing.data, closing.len, &tail, &n_tail, err);
    if (!rc) rc = feed(s, tail, (int)n_tail, 0, err);
    if (!rc && json_array_append(s->messages, msg)) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (!rc) {
        /* flush the display: a held partial character, then text the parser was holding back */
        dsv4_sb_clear(&s->piece);
        dsv4_detokenizer_finish(&s->detok, &s->piece);
        show_text(s, s->piece.data, s->piece.len);
        if (!s->raw_mode && dsv4_dsml_finish(s->parser) == DSV4_DSML_MALFORMED) switch_to_raw(s);
        turn_free(s);
    }
    dsv4_sb_free(&closing);
    json_decref(msg);
    free(text);
    free(tail);
    return rc;
}

/* ---- accessors ----------------------------------------------------------------------------------------- */

int            dsv4_chat_session_turn_open(const dsv4_chat_session *s) { return s->turn_open; }
int            dsv4_chat_session_reply_len(const dsv4_chat_session *s) { return s->reply_len; }
int64_t        dsv4_chat_session_position(const dsv4_chat_session *s) { return dsv4_seq_position(s->seq); }
const int32_t *dsv4_chat_session_tokens(const dsv4_chat_session *s) { return dsv4_seq_tokens(s->seq); }
const json_t  *dsv4_chat_session_messages(const dsv4_chat_session *s) { return s->messages; }

int dsv4_chat_session_render_full(const dsv4_chat_session *s, char **out, size_t *len, dsv4_error *err) {
    return render(s->messages, s->last_thinking, out, len, err);
}
