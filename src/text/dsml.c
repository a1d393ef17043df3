#define _GNU_SOURCE /* memmem */
#include "text/dsml.h"
#include "text/chat.h"
#include "text/pyjson.h"
#include "text/strbuf.h"
#include "text/utf8.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSML "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"
static const char CALLS_START[] = "\n\n<" DSML "tool_calls";
static const char CALLS_END[] = "</" DSML "tool_calls>";
static const char INVOKE_OPEN[] = "<" DSML "invoke";
static const char INVOKE_CLOSE[] = "</" DSML "invoke";
static const char PARAM_OPEN[] = "<" DSML "parameter";
static const char PARAM_CLOSE[] = "/" DSML "parameter";

typedef enum {
    S_REASONING, S_CONTENT,
    S_BLOCK,        /* between invokes: expect ">\n" then an invoke or the end of the block */
    S_HEADER,       /* after "<｜DSML｜invoke": ` name="N">\n` */
    S_PARAM,        /* after "<｜DSML｜parameter": ` name="K" string="..">V<` */
    S_AFTER_PARAM,  /* after "/｜DSML｜parameter": ">\n" */
    S_AFTER_CALLS,  /* after the block: only EOS */
    S_DONE, S_ERROR,
} state;

typedef struct { char *key, *value; int is_str; } param;

struct dsv4_dsml_parser {
    dsv4_dsml_callbacks cb;
    state st;
    dsv4_dsml_status status;
    int   saw_eos;
    dsv4_strbuf raw, reasoning, content, error;
    size_t pos;     /* raw[0..pos) is consumed */
    size_t scan;    /* where the next marker search may start (markers cannot begin before it) */
    /* the invoke being parsed */
    char  *name;
    param *params;
    int    n_params, cap_params;
    dsv4_tool_call *calls;
    int    n_calls, cap_calls;
    /* streaming of the invoke being parsed (on_call_begin, on_arguments) */
    int    stream_ok;     /* the name was announced and every piece so far is part of the final arguments */
    int    n_streamed;    /* parameters whose key went out (the first one after "{") */
    int    pmode;         /* the current parameter: 0 nothing out yet, 1 a string value going out, 2 a value held */
    int    val_nul;       /* the string value has a NUL byte: it ends there (values are C strings) */
    char  *pkey;          /* the key that went out for it */
    size_t val_start, val_from;   /* raw offsets: the string value's start, and its next byte to go out */
    dsv4_strbuf frag;     /* scratch for one piece */
};

dsv4_dsml_parser *dsv4_dsml_new(int thinking, const dsv4_dsml_callbacks *cb) {
    dsv4_dsml_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    if (cb) p->cb = *cb;
    p->st = thinking ? S_REASONING : S_CONTENT;
    return p;
}

static void clear_invoke(dsv4_dsml_parser *p) {
    free(p->name);
    p->name = NULL;
    free(p->pkey);
    p->pkey = NULL;
    p->stream_ok = p->n_streamed = p->pmode = p->val_nul = 0;
    for (int i = 0; i < p->n_params; i++) { free(p->params[i].key); free(p->params[i].value); }
    p->n_params = 0;
}

void dsv4_dsml_free(dsv4_dsml_parser *p) {
    if (!p) return;
    clear_invoke(p);
    free(p->params);
    for (int i = 0; i < p->n_calls; i++) { free(p->calls[i].name); free(p->calls[i].arguments); }
    free(p->calls);
    dsv4_sb_free(&p->raw); dsv4_sb_free(&p->reasoning); dsv4_sb_free(&p->content); dsv4_sb_free(&p->error);
    dsv4_sb_free(&p->frag);
    free(p);
}

static dsv4_dsml_status fail(dsv4_dsml_parser *p, dsv4_dsml_status st, const char *fmt, const char *arg) {
    dsv4_sb_clear(&p->error);
    dsv4_sb_printf(&p->error, fmt, arg ? arg : "");
    p->st = S_ERROR;
    p->status = st;
    return st;
}

static void emit(dsv4_dsml_parser *p, int reasoning, const char *s, size_t n) {
    if (!n) return;
    dsv4_sb_append(reasoning ? &p->reasoning : &p->content, s, n);
    void (*fn)(void *, const char *, size_t) = reasoning ? p->cb.on_reasoning : p->cb.on_content;
    if (fn) fn(p->cb.ud, s, n);
}

/* Earliest occurrence (from p->pos) of any marker; returns its offset or -1, with *which its index.
 * p->scan avoids rescanning text already known to hold no marker start. */
static long find_marker(dsv4_dsml_parser *p, const char *const *m, int n, int *which) {
    size_t from = p->scan > p->pos ? p->scan : p->pos;
    long best = -1;
    size_t longest = 0;
    for (int i = 0; i < n; i++) {
        size_t ml = strlen(m[i]);
        if (ml > longest) longest = ml;
        if (p->raw.len < from + ml) continue;
        const char *hit = memmem(p->raw.data + from, p->raw.len - from, m[i], ml);
        if (hit && (best < 0 || hit - p->raw.data < best)) { best = hit - p->raw.data; *which = i; }
    }
    if (best < 0) p->scan = p->raw.len >= longest ? p->raw.len - longest + 1 : 0;
    return best;
}

/* How many trailing bytes of raw could be the beginning of one of the markers (and must be held back). */
static size_t partial_tail(const dsv4_dsml_parser *p, const char *const *m, int n) {
    size_t avail = p->raw.len - p->pos, hold = 0;
    for (int i = 0; i < n; i++) {
        size_t ml = strlen(m[i]);
        for (size_t k = ml - 1; k > hold; k--)
            if (k <= avail && !memcmp(p->raw.data + p->raw.len - k, m[i], k)) { hold = k; break; }
    }
    return hold;
}

static void consume(dsv4_dsml_parser *p, size_t to) { p->pos = to; p->scan = to; }

/* The text between pos and a marker must be exactly ">\n". While the marker is not there yet, the text seen so
 * far must still be able to become that. */
static int gap_ok(const dsv4_dsml_parser *p, size_t end) {
    return end - p->pos == 2 && !memcmp(p->raw.data + p->pos, ">\n", 2);
}
static int gap_may_grow(const dsv4_dsml_parser *p, size_t longest_marker) {
    size_t avail = p->raw.len - p->pos;
    size_t k = avail < 2 ? avail : 2;
    return !memcmp(p->raw.data + p->pos, ">\n", k) && avail < 2 + longest_marker;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

/* ` name="N">\n` (leading whitespace allowed; Python's `\n$` also accepts one extra trailing newline). */
static char *parse_header(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    if (n - i < 6 || memcmp(s + i, "name=\"", 6)) return NULL;
    i += 6;
    size_t end = n;
    if (end - i >= 4 && !memcmp(s + end - 4, "\">\n\n", 4)) end -= 4;
    else if (end - i >= 3 && !memcmp(s + end - 3, "\">\n", 3)) end -= 3;
    else return NULL;
    return dup_n(s + i, end - i);
}

/* ` name="K" string="true|false">V<`: K is the shortest prefix followed by a valid string attribute. */
static int parse_param(const char *s, size_t n, param *out) {
    if (n < 7 || memcmp(s, " name=\"", 7)) return -1;
    size_t end = n;
    if (end && s[end - 1] == '\n') end--;           /* Python `$` before a final newline */
    if (!end || s[end - 1] != '<') {
        end = n;
        if (!end || s[end - 1] != '<') return -1;
    }
    end--;  /* drop the '<' */
    static const char *const ATTR[2] = {"\" string=\"true\">", "\" string=\"false\">"};
    for (size_t k = 7; k < end; k++) {
        for (int a = 0; a < 2; a++) {
            size_t al = strlen(ATTR[a]);
            if (k + al <= end && !memcmp(s + k, ATTR[a], al)) {
                out->key = dup_n(s + 7, k - 7);
                out->value = dup_n(s + k + al, end - k - al);
                out->is_str = a == 0;
                return out->key && out->value ? 0 : -1;
            }
        }
    }
    return -1;
}

static int valid_utf8(const char *s) {
    size_t n = strlen(s);
    return dsv4_utf8_valid_prefix(s, n) == n;
}

/* ---- streaming the arguments (on_call_begin, on_arguments) --------------------------------------------------
 * The pieces are the arguments finish_invoke builds, cut earlier: "{" (or ", ") + key + ": " once a parameter's
 * attribute is read, a string value's escaped bytes as they arrive, its closing quote or a non-string value when
 * the parameter closes, "}" when the invoke closes. Anything that would make finish_invoke fail (ill-formed
 * UTF-8, a non-JSON value) only stops the pieces here: finish_invoke reports it, in its own order. */

static const char *const ATTRS[2] = {"\" string=\"true\">", "\" string=\"false\">"};

static void send_frag(dsv4_dsml_parser *p) {
    if (p->frag.len && p->cb.on_arguments && !p->frag.oom) p->cb.on_arguments(p->cb.ud, p->frag.data, p->frag.len);
    dsv4_sb_clear(&p->frag);
}

/* "{" or ", ", the key, ": " (and the opening quote of a string value) into frag. */
static void frag_key(dsv4_dsml_parser *p, const char *key, size_t n) {
    dsv4_sb_puts(&p->frag, p->n_streamed ? ", " : "{");
    dsv4_pyjson_string(&p->frag, key, n);
    dsv4_sb_puts(&p->frag, ": ");
    p->n_streamed++;
}

/* The string value's bytes raw[val_from .. limit) that are whole UTF-8 characters go out. */
static void stream_value_upto(dsv4_dsml_parser *p, size_t limit) {
    if (limit <= p->val_from || p->val_nul) return;
    const char *s = p->raw.data + p->val_from;
    size_t n = limit - p->val_from;
    /* the parsed value is a C string: it stops at a NUL byte, and so does what goes out */
    const char *nul = memchr(s, 0, n);
    if (nul) { n = (size_t)(nul - s); p->val_nul = 1; }
    const size_t ok = dsv4_utf8_valid_prefix(s, n);
    if (nul && ok < n) { p->stream_ok = 0; return; }
    if (n - ok >= 4) { p->stream_ok = 0; return; }   /* not a character cut short: ill-formed */
    dsv4_pyjson_escape(&p->frag, s, ok);
    p->val_from += ok;
    send_frag(p);
}

/* S_PARAM before its end tag: the attribute once it is there, then the value so far. */
static void stream_param_partial(dsv4_dsml_parser *p) {
    if (!p->stream_ok) return;
    const char *s = p->raw.data + p->pos;
    const size_t n = p->raw.len - p->pos;
    if (p->pmode == 0) {
        if (n < 7 || memcmp(s, " name=\"", 7)) return;
        /* the key is the shortest prefix followed by an attribute (parse_param): the first attribute seen */
        size_t k = n;
        int which = -1;
        for (int a = 0; a < 2; a++) {
            const char *hit = memmem(s + 7, n - 7, ATTRS[a], strlen(ATTRS[a]));
            if (hit && (size_t)(hit - s) < k) { k = (size_t)(hit - s); which = a; }
        }
        if (which < 0) return;
        /* the key is a C string too (dup_n, then strlen) */
        if (!(p->pkey = dup_n(s + 7, k - 7))) { p->stream_ok = 0; return; }
        const size_t kl = strlen(p->pkey);
        if (dsv4_utf8_valid_prefix(p->pkey, kl) != kl) { p->stream_ok = 0; return; }
        frag_key(p, p->pkey, kl);
        if (which == 0) {
            dsv4_sb_putc(&p->frag, '"');
            p->pmode = 1;
            p->val_start = p->val_from = p->pos + k + strlen(ATTRS[0]);
        } else {
            p->pmode = 2;   /* a non-string value goes out whole, once it is known to be JSON */
        }
        send_frag(p);
    }
    if (p->pmode == 1) {
        /* hold back what could still become "<" ["\n"] "/｜DSML｜parameter": the value ends before the "<" */
        const char *stops[1] = {PARAM_CLOSE};
        const size_t hold = partial_tail(p, stops, 1) + 2;
        if (p->raw.len >= p->val_from + hold) stream_value_upto(p, p->raw.len - hold);
    }
}

/* S_PARAM at its end tag, with the parsed parameter: the rest of it goes out. */
static void stream_param_done(dsv4_dsml_parser *p, const param *q) {
    if (!p->stream_ok) return;
    const size_t kl = strlen(q->key), vl = strlen(q->value);
    if (p->pmode == 0) {
        if (dsv4_utf8_valid_prefix(q->key, kl) != kl) { p->stream_ok = 0; return; }
        frag_key(p, q->key, kl);
    } else if (strcmp(p->pkey, q->key) || (p->pmode == 1) != q->is_str) {
        p->stream_ok = 0;   /* cannot happen (the first attribute is the one parse_param takes); finish_invoke says so */
        return;
    }
    if (q->is_str) {
        const size_t done = p->pmode == 1 ? p->val_from - p->val_start : 0;
        if (done > vl || dsv4_utf8_valid_prefix(q->value + done, vl - done) != vl - done) { p->stream_ok = 0; return; }
        if (p->pmode == 0) dsv4_sb_putc(&p->frag, '"');
        dsv4_pyjson_escape(&p->frag, q->value + done, vl - done);
        dsv4_sb_putc(&p->frag, '"');
    } else {
        json_error_t je;
        json_t *v = json_loads(q->value, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v) { p->stream_ok = 0; dsv4_sb_clear(&p->frag); return; }
        json_decref(v);
        dsv4_sb_append(&p->frag, q->value, vl);
    }
    send_frag(p);
    free(p->pkey);
    p->pkey = NULL;
    p->pmode = 0;
}

static dsv4_dsml_status finish_invoke(dsv4_dsml_parser *p) {
    /* The arguments must be JSON, and JSON text is UTF-8: a name, key or string value with ill-formed UTF-8
     * (decoded model output never has any, but the parser takes any bytes) would make them invalid.
     * (Found by tests/fuzz/fuzz_dsml.c.) */
    if (!valid_utf8(p->name)) return fail(p, DSV4_DSML_MALFORMED, "tool call name is not valid UTF-8%s", NULL);
    for (int i = 0; i < p->n_params; i++)
        if (!valid_utf8(p->params[i].key) || (p->params[i].is_str && !valid_utf8(p->params[i].value)))
            return fail(p, DSV4_DSML_MALFORMED, "a parameter of tool call '%s' is not valid UTF-8", p->name);
    dsv4_strbuf args;
    dsv4_sb_init(&args);
    dsv4_sb_putc(&args, '{');
    for (int i = 0; i < p->n_params; i++) {
        param *q = &p->params[i];
        if (i) dsv4_sb_puts(&args, ", ");
        dsv4_pyjson_string(&args, q->key, strlen(q->key));
        dsv4_sb_puts(&args, ": ");
        if (q->is_str) {
            dsv4_pyjson_string(&args, q->value, strlen(q->value));
        } else {
            json_error_t je;
            json_t *v = json_loads(q->value, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!v) {
                dsv4_sb_free(&args);
                return fail(p, DSV4_DSML_MALFORMED, "parameter '%s' has string=\"false\" but its value is not JSON",
                            q->key);
            }
            json_decref(v);
            dsv4_sb_puts(&args, q->value);
        }
    }
    dsv4_sb_putc(&args, '}');
    if (p->n_calls == p->cap_calls) {
        int cap = p->cap_calls ? p->cap_calls * 2 : 4;
        dsv4_tool_call *c = realloc(p->calls, (size_t)cap * sizeof *c);
        if (!c) { dsv4_sb_free(&args); return fail(p, DSV4_DSML_MALFORMED, "out of memory%s", NULL); }
        p->calls = c;
        p->cap_calls = cap;
    }
    /* every check above passed, so every piece went out: close the object */
    if (!p->stream_ok) { dsv4_sb_free(&args); return fail(p, DSV4_DSML_MALFORMED, "tool call '%s': streamed arguments lost", p->name); }
    dsv4_sb_puts(&p->frag, p->n_streamed ? "}" : "{}");
    send_frag(p);
    char *a = dsv4_sb_take(&args, NULL);
    if (!a) return fail(p, DSV4_DSML_MALFORMED, "out of memory%s", NULL);
    dsv4_tool_call *call = &p->calls[p->n_calls++];
    call->name = p->name;
    call->arguments = a;
    p->name = NULL;
    clear_invoke(p);
    if (p->cb.on_tool_call) p->cb.on_tool_call(p->cb.ud, call);
    return DSV4_DSML_OK;
}

/* Run the state machine as far as the text allows. */
static dsv4_dsml_status advance(dsv4_dsml_parser *p) {
    for (;;) {
        const char *const *m;
        int nm, which = -1;
        long at;
        const char *text_stops[2] = {p->st == S_REASONING ? DSV4_THINK_END_TEXT : DSV4_EOS_TEXT, CALLS_START};
        switch (p->st) {
        case S_REASONING:
        case S_CONTENT: {
            int reasoning = p->st == S_REASONING;
            m = text_stops; nm = 2;
            at = find_marker(p, m, nm, &which);
            if (at < 0) {
                size_t hold = partial_tail(p, m, nm);
                size_t upto = p->raw.len - hold;
                if (upto > p->pos) { emit(p, reasoning, p->raw.data + p->pos, upto - p->pos); p->pos = upto; }
                return p->status;
            }
            emit(p, reasoning, p->raw.data + p->pos, (size_t)at - p->pos);
            consume(p, (size_t)at + strlen(m[which]));
            if (reasoning && which == 1)
                return fail(p, DSV4_DSML_MALFORMED, "tool calls inside the reasoning (no </think> before them)%s", NULL);
            if (reasoning) p->st = S_CONTENT;
            else if (which == 0) { p->saw_eos = 1; p->st = S_DONE; }
            else p->st = S_BLOCK;
            continue;
        }
        case S_BLOCK:
        case S_AFTER_PARAM: {
            const char *block_stops[2] = {INVOKE_OPEN, CALLS_END};
            const char *param_stops[2] = {PARAM_OPEN, INVOKE_CLOSE};
            m = p->st == S_BLOCK ? block_stops : param_stops;
            at = find_marker(p, m, 2, &which);
            if (at < 0) {
                if (!gap_may_grow(p, strlen(m[1]) > strlen(m[0]) ? strlen(m[1]) : strlen(m[0])))
                    return fail(p, DSV4_DSML_MALFORMED, "tool call format: expected '>\\n' before the next tag%s", NULL);
                return p->status;
            }
            if (!gap_ok(p, (size_t)at))
                return fail(p, DSV4_DSML_MALFORMED, "tool call format: expected '>\\n' before the next tag%s", NULL);
            consume(p, (size_t)at + strlen(m[which]));
            if (p->st == S_BLOCK) p->st = which == 0 ? S_HEADER : S_AFTER_CALLS;
            else if (which == 0) p->st = S_PARAM;
            else {
                dsv4_dsml_status s = finish_invoke(p);
                if (s) return s;
                p->st = S_BLOCK;
            }
            continue;
        }
        case S_HEADER: {
            const char *stops[2] = {PARAM_OPEN, INVOKE_CLOSE};
            at = find_marker(p, stops, 2, &which);
            if (at < 0) return p->status;
            clear_invoke(p);
            p->name = parse_header(p->raw.data + p->pos, (size_t)at - p->pos);
            if (!p->name) return fail(p, DSV4_DSML_MALFORMED, "tool call format: bad invoke tag (want name=\"...\">\\n)%s", NULL);
            if (valid_utf8(p->name)) {
                p->stream_ok = 1;
                if (p->cb.on_call_begin) p->cb.on_call_begin(p->cb.ud, p->name);
            }
            consume(p, (size_t)at + strlen(stops[which]));
            if (which == 0) p->st = S_PARAM;
            else {
                dsv4_dsml_status s = finish_invoke(p);
                if (s) return s;
                p->st = S_BLOCK;
            }
            continue;
        }
        case S_PARAM: {
            const char *stops[1] = {PARAM_CLOSE};
            at = find_marker(p, stops, 1, &which);
            if (at < 0) { stream_param_partial(p); return p->status; }
            param q;
            if (parse_param(p->raw.data + p->pos, (size_t)at - p->pos, &q))
                return fail(p, DSV4_DSML_MALFORMED, "tool call format: bad parameter tag in invoke '%s'", p->name);
            for (int i = 0; i < p->n_params; i++)
                if (!strcmp(p->params[i].key, q.key)) {
                    dsv4_dsml_status s = fail(p, DSV4_DSML_MALFORMED, "duplicate parameter name '%s'", q.key);
                    free(q.key); free(q.value);
                    return s;
                }
            if (p->n_params == p->cap_params) {
                int cap = p->cap_params ? p->cap_params * 2 : 4;
                param *np = realloc(p->params, (size_t)cap * sizeof *np);
                if (!np) { free(q.key); free(q.value); return fail(p, DSV4_DSML_MALFORMED, "out of memory%s", NULL); }
                p->params = np;
                p->cap_params = cap;
            }
            p->params[p->n_params++] = q;
            stream_param_done(p, &p->params[p->n_params - 1]);
            consume(p, (size_t)at + strlen(stops[0]));
            p->st = S_AFTER_PARAM;
            continue;
        }
        case S_AFTER_CALLS: {
            const char *stops[1] = {DSV4_EOS_TEXT};
            at = find_marker(p, stops, 1, &which);
            size_t end = at < 0 ? p->raw.len : (size_t)at, avail = end - p->pos, el = strlen(DSV4_EOS_TEXT);
            /* Only EOS may follow the block; while it is incomplete, the text must be a prefix of it. */
            if (at >= 0 ? avail != 0 : (avail >= el || memcmp(p->raw.data + p->pos, DSV4_EOS_TEXT, avail)))
                return fail(p, DSV4_DSML_MALFORMED, "unexpected text after the tool calls%s", NULL);
            if (at < 0) return p->status;
            consume(p, (size_t)at + strlen(DSV4_EOS_TEXT));
            p->saw_eos = 1;
            p->st = S_DONE;
            continue;
        }
        case S_DONE:
            if (p->raw.len > p->pos) return fail(p, DSV4_DSML_MALFORMED, "text after the end of the message%s", NULL);
            return p->status;
        case S_ERROR:
            return p->status;
        }
    }
}

dsv4_dsml_status dsv4_dsml_feed(dsv4_dsml_parser *p, const char *text, size_t n) {
    dsv4_sb_append(&p->raw, text, n);
    if (p->raw.oom) return fail(p, DSV4_DSML_MALFORMED, "out of memory%s", NULL);
    if (p->st == S_ERROR) return p->status;
    return advance(p);
}

dsv4_dsml_status dsv4_dsml_finish(dsv4_dsml_parser *p) {
    if (p->st == S_ERROR) return p->status;
    advance(p);
    /* raw.data is NULL when nothing was fed: no pointer arithmetic on it (UBSan, tests/fuzz/fuzz_dsml.c) */
    const char *rest = p->raw.data ? p->raw.data + p->pos : "";
    switch (p->st) {
    case S_REASONING:
        emit(p, 1, rest, p->raw.len - p->pos);
        consume(p, p->raw.len);
        return fail(p, DSV4_DSML_TRUNCATED, "output ended inside the reasoning (no </think>)%s", NULL);
    case S_CONTENT:
        emit(p, 0, rest, p->raw.len - p->pos);
        consume(p, p->raw.len);
        p->st = S_DONE;
        break;
    case S_AFTER_CALLS:
        if (p->raw.len > p->pos) return fail(p, DSV4_DSML_MALFORMED, "unexpected text after the tool calls%s", NULL);
        p->st = S_DONE;
        break;
    case S_DONE:
        break;
    case S_ERROR:
        return p->status;
    default:
        return fail(p, DSV4_DSML_TRUNCATED, "output ended inside the tool-call block%s", NULL);
    }
    /* The official safety check: no control markers inside reasoning or content. */
    const char *const forbidden[5] = {DSV4_BOS_TEXT, DSV4_EOS_TEXT, DSV4_THINK_TEXT, DSV4_THINK_END_TEXT, DSML};
    /* memmem, not strstr: a NUL byte in the output must not hide a marker after it */
    for (int i = 0; i < 5; i++) {
        const size_t fl = strlen(forbidden[i]);
        if ((p->content.data && memmem(p->content.data, p->content.len, forbidden[i], fl)) ||
            (p->reasoning.data && memmem(p->reasoning.data, p->reasoning.len, forbidden[i], fl)))
            return fail(p, DSV4_DSML_MALFORMED, "special token %s inside the reasoning or content", forbidden[i]);
    }
    return p->status;
}

dsv4_dsml_status dsv4_dsml_status_of(const dsv4_dsml_parser *p) { return p->status; }
const char *dsv4_dsml_error(const dsv4_dsml_parser *p) { return p->error.data ? p->error.data : ""; }
const char *dsv4_dsml_reasoning(const dsv4_dsml_parser *p, size_t *n) {
    if (n) *n = p->reasoning.len;
    return p->reasoning.data ? p->reasoning.data : "";
}
const char *dsv4_dsml_content(const dsv4_dsml_parser *p, size_t *n) {
    if (n) *n = p->content.len;
    return p->content.data ? p->content.data : "";
}
const char *dsv4_dsml_raw(const dsv4_dsml_parser *p, size_t *n) {
    if (n) *n = p->raw.len;
    return p->raw.data ? p->raw.data : "";
}
int dsv4_dsml_n_calls(const dsv4_dsml_parser *p) { return p->n_calls; }
const dsv4_tool_call *dsv4_dsml_call(const dsv4_dsml_parser *p, int i) {
    return i >= 0 && i < p->n_calls ? &p->calls[i] : NULL;
}
int dsv4_dsml_saw_eos(const dsv4_dsml_parser *p) { return p->saw_eos; }
