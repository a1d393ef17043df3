/* Token ids -> reasoning, content, tool calls, stop strings: see output.h. */
#include "server/output.h"
#include "text/chat.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- stop strings over the content --------------------------------------------------------------------- */

/* Release held content up to `upto`, never in the middle of a UTF-8 character. */
static void release_held(server_output *o, size_t upto) {
    while (upto > 0 && upto < o->held.len && ((unsigned char)o->held.data[upto] & 0xC0) == 0x80) upto--;
    if (!upto) return;
    dsv4_sb_append(&o->content, o->held.data, upto);
    dsv4_sb_consume(&o->held, upto);
}

static void add_content(server_output *o, const char *s, size_t n) {
    if (o->stopped || !n) return;
    if (!o->n_stop) { dsv4_sb_append(&o->content, s, n); return; }
    dsv4_sb_append(&o->held, s, n);
    /* the earliest match of any stop string ends the content */
    size_t best = (size_t)-1;
    for (int i = 0; i < o->n_stop; i++) {
        const size_t ls = strlen(o->stop[i]);
        if (ls > o->held.len) continue;
        for (size_t p = 0; p + ls <= o->held.len && p < best; p++)
            if (!memcmp(o->held.data + p, o->stop[i], ls)) { best = p; o->stop_index = i; break; }
    }
    if (best != (size_t)-1) {
        if (best) dsv4_sb_append(&o->content, o->held.data, best);
        dsv4_sb_clear(&o->held);
        o->stopped = 1;
        return;
    }
    /* hold back only the longest tail that is still the start of some stop string */
    size_t keep = 0;
    for (int i = 0; i < o->n_stop; i++) {
        const size_t ls = strlen(o->stop[i]);
        for (size_t k = ls - 1 < o->held.len ? ls - 1 : o->held.len; k > keep; k--)
            if (!memcmp(o->held.data + o->held.len - k, o->stop[i], k)) { keep = k; break; }
    }
    release_held(o, o->held.len - keep);
}

/* ---- DSML callbacks ---------------------------------------------------------------------------------------- */

static void on_reasoning(void *ud, const char *s, size_t n) {
    server_output *o = ud;
    o->seen_reasoning += n;
    if (!o->stopped) dsv4_sb_append(&o->reasoning, s, n);
}

static void on_content(void *ud, const char *s, size_t n) {
    server_output *o = ud;
    o->seen_content += n;
    add_content(o, s, n);
}

static void on_call(void *ud, const dsv4_tool_call *c) {
    server_output *o = ud;
    if (o->stopped) return;
    if (o->n_calls == o->cap_calls) {
        const int nc = o->cap_calls ? 2 * o->cap_calls : 4;
        server_call *v = realloc(o->calls, sizeof *v * (size_t)nc);
        if (!v) return;
        o->calls = v;
        o->cap_calls = nc;
    }
    server_call *d = &o->calls[o->n_calls];
    d->name = strdup(c->name ? c->name : "");
    d->arguments = strdup(c->arguments ? c->arguments : "{}");
    if (!d->name || !d->arguments) { free(d->name); free(d->arguments); return; }
    o->n_calls++;
}

static void on_call_begin(void *ud, const char *name) {
    server_output *o = ud;
    if (o->stopped) return;
    free(o->cur_name);
    o->cur_name = strdup(name);
    dsv4_sb_clear(&o->cur_args);
    o->n_begun++;
}

static void on_arguments(void *ud, const char *s, size_t n) {
    server_output *o = ud;
    if (!o->stopped) dsv4_sb_append(&o->cur_args, s, n);
}

int server_output_call(const server_output *o, int k, const char **name, const char **args, size_t *n_args) {
    if (k < o->n_calls) {
        *name = o->calls[k].name;
        *args = o->calls[k].arguments;
        *n_args = strlen(*args);
        return 1;
    }
    *name = o->cur_name ? o->cur_name : "";
    *args = o->cur_args.data ? o->cur_args.data : "";
    *n_args = o->cur_args.len;
    return 0;
}

/* The parser stopped on malformed DSML: what it had not released, and all later text, is content. */
static void switch_to_raw(server_output *o) {
    size_t n_raw;
    const char *raw = dsv4_dsml_raw(o->dsml, &n_raw);
    size_t off = o->seen_reasoning;
    const size_t lt = strlen(DSV4_THINK_END_TEXT);
    if (o->thinking && off + lt <= n_raw && !memcmp(raw + off, DSV4_THINK_END_TEXT, lt)) off += lt;
    off += o->seen_content;
    o->raw_mode = 1;
    if (off < n_raw) add_content(o, raw + off, n_raw - off);
}

static void add_text(server_output *o, const char *s, size_t n) {
    if (!n) return;
    if (!o->dsml || o->raw_mode) { add_content(o, s, n); return; }
    if (dsv4_dsml_feed(o->dsml, s, n) == DSV4_DSML_MALFORMED) switch_to_raw(o);
}

/* ---- lifetime ---------------------------------------------------------------------------------------------- */

int server_output_init(server_output *o, const dsv4_tokenizer *t, int chat, int thinking, char *const *stop, int n_stop,
                       const int32_t *skip_ids, int n_skip) {
    memset(o, 0, sizeof *o);
    o->tok = t;
    dsv4_detokenizer_init(&o->detok, t);
    dsv4_sb_init(&o->piece);
    dsv4_sb_init(&o->held);
    dsv4_sb_init(&o->reasoning);
    dsv4_sb_init(&o->content);
    dsv4_sb_init(&o->cur_args);
    o->thinking = thinking;
    o->stop = stop;
    o->n_stop = n_stop;
    o->stop_index = -1;
    o->n_skip = n_skip > 4 ? 4 : n_skip;
    if (o->n_skip) memcpy(o->skip, skip_ids, sizeof(int32_t) * (size_t)o->n_skip);
    if (chat) {
        dsv4_dsml_callbacks cb = {on_reasoning, on_content, on_call, o, on_call_begin, on_arguments};
        o->dsml = dsv4_dsml_new(thinking, &cb);
        if (!o->dsml) return -1;
    }
    return 0;
}

void server_output_free(server_output *o) {
    dsv4_sb_free(&o->piece);
    dsv4_sb_free(&o->held);
    dsv4_sb_free(&o->reasoning);
    dsv4_sb_free(&o->content);
    dsv4_sb_free(&o->cur_args);
    free(o->cur_name);
    if (o->dsml) dsv4_dsml_free(o->dsml);
    for (int i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    free(o->calls);
    memset(o, 0, sizeof *o);
}

int server_output_push(server_output *o, int32_t id) {
    if (o->stopped) return 1;
    o->n_tokens++;
    for (int i = 0; i < o->n_skip; i++)
        if (id == o->skip[i]) return 0;
    if (dsv4_detokenizer_push(&o->detok, id, &o->piece, NULL) == 0) add_text(o, o->piece.data, o->piece.len);
    dsv4_sb_clear(&o->piece);
    return o->stopped;
}

void server_output_finish(server_output *o) {
    dsv4_detokenizer_finish(&o->detok, &o->piece);
    add_text(o, o->piece.data, o->piece.len);
    dsv4_sb_clear(&o->piece);
    if (o->dsml && !o->raw_mode) {
        if (dsv4_dsml_finish(o->dsml) == DSV4_DSML_MALFORMED) switch_to_raw(o);
        else if (dsv4_dsml_status_of(o->dsml) == DSV4_DSML_TRUNCATED && !o->stopped) {
            /* cut off inside a tool-call block (the token limit): the unfinished block is shown as content */
            size_t n_raw;
            const char *raw = dsv4_dsml_raw(o->dsml, &n_raw);
            size_t off = o->seen_reasoning + o->seen_content;
            const size_t lt = strlen(DSV4_THINK_END_TEXT);
            if (o->thinking && o->seen_reasoning + lt <= n_raw && !memcmp(raw + o->seen_reasoning, DSV4_THINK_END_TEXT, lt))
                off += lt;
            /* inside the reasoning nothing more is held: only a tool block can be pending */
            if (off < n_raw && o->n_calls == 0 && (!o->thinking || off > o->seen_reasoning)) add_content(o, raw + off, n_raw - off);
        }
    }
    if (!o->stopped && o->held.len) {
        dsv4_sb_append(&o->content, o->held.data, o->held.len);
        dsv4_sb_clear(&o->held);
    }
}

const char *server_output_new_reasoning(server_output *o, size_t *n) {
    *n = o->reasoning.len - o->taken_reasoning;
    const char *p = o->reasoning.data ? o->reasoning.data + o->taken_reasoning : "";
    o->taken_reasoning = o->reasoning.len;
    return p;
}

const char *server_output_new_content(server_output *o, size_t *n) {
    *n = o->content.len - o->taken_content;
    const char *p = o->content.data ? o->content.data + o->taken_content : "";
    o->taken_content = o->content.len;
    return p;
}

/* ---- JSON text from bytes ------------------------------------------------------------------------------------ */

/* Length of the well-formed UTF-8 character at s (1..4), or 0 when ill-formed. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    const unsigned char c = s[0];
    size_t len;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    return len;
}

json_t *server_json_text(const char *s, size_t n) {
    dsv4_strbuf b;
    dsv4_sb_init(&b);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const size_t l = utf8_char(u + i, n - i);
        if (l && !(l == 1 && u[i] == 0)) { dsv4_sb_append(&b, s + i, l); i += l; }
        else { dsv4_sb_puts(&b, "\xEF\xBF\xBD"); i++; }
    }
    json_t *v = json_stringn(b.data ? b.data : "", b.len);
    dsv4_sb_free(&b);
    return v;
}
