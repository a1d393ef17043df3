/* dsv4 tokenize: text -> comma-separated ids, or ids -> text with --decode (DESIGN section 7).
 *   dsv4 tokenize (-m DIR | --tokenizer FILE) (--text T | --file F) [--lines | --jsonl] [--decode] [--plain]
 * --lines : one output line per input line (the line's newline is not part of the text).
 * --jsonl : like --lines, but every input line (encode) or output line (decode) is a JSON string, so texts may
 *           hold newlines; this is what the tests use.
 * --plain : do not match added/special tokens (treat the input as untrusted text).
 * BOS is prepended only when tokenizer_config.json says add_bos_token (V4 does not). */
#include "cli/cli.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"
#include "util/fileio.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *CMD = "tokenize";

static int encode_one(const dsv4_tokenizer *t, const char *s, size_t n, int flags, dsv4_strbuf *out) {
    int32_t *ids;
    size_t k;
    dsv4_error err;
    if (dsv4_tokenizer_encode(t, s, n, flags, &ids, &k, &err)) return cli_fail(CMD, &err);
    for (size_t i = 0; i < k; i++) dsv4_sb_printf(out, i ? ",%d" : "%d", ids[i]);
    free(ids);
    return 0;
}

/* Parse "1, 2,3" (an empty string is an empty list). */
static int parse_ids(const char *s, size_t n, int32_t **ids, size_t *k) {
    size_t cap = 16, cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return cli_error(CMD, "out of memory");
    size_t i = 0;
    for (;;) {
        while (i < n && strchr(" \t\r\n,", s[i])) i++;
        if (i >= n) break;
        long long x = 0;
        size_t start = i;
        while (i < n && s[i] >= '0' && s[i] <= '9' && x <= 2147483647LL) x = x * 10 + (s[i++] - '0');
        if (i == start || x > 2147483647LL || (i < n && !strchr(" \t\r\n,", s[i]))) {
            free(v);
            return cli_error(CMD, "bad token id list near '%.20s'", s + start);
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) { free(v); return cli_error(CMD, "out of memory"); }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
    }
    *ids = v;
    *k = cnt;
    return 0;
}

static int decode_one(const dsv4_tokenizer *t, const char *s, size_t n, int as_json, dsv4_strbuf *out) {
    int32_t *ids = NULL;
    size_t k = 0;
    if (parse_ids(s, n, &ids, &k)) return 1;
    char *text;
    size_t len;
    dsv4_error err;
    int rc = dsv4_tokenizer_decode(t, ids, k, &text, &len, &err);
    free(ids);
    if (rc) return cli_fail(CMD, &err);
    if (as_json) dsv4_pyjson_string(out, text, len);
    else dsv4_sb_append(out, text, len);
    free(text);
    return 0;
}

/* Process one input line in --lines/--jsonl mode. */
static int do_line(const dsv4_tokenizer *t, const char *s, size_t n, int decode, int jsonl, int flags,
                   size_t lineno, dsv4_strbuf *out) {
    if (decode) return decode_one(t, s, n, jsonl, out);
    if (!jsonl) return encode_one(t, s, n, flags, out);
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!json_is_string(v)) {
        json_decref(v);
        return cli_error(CMD, "line %zu: expected a JSON string", lineno);
    }
    int rc = encode_one(t, json_string_value(v), json_string_length(v), flags, out);
    json_decref(v);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *text = NULL, *input = NULL;
    int lines = 0, jsonl = 0, decode = 0, plain = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") && !(dir = cli_value(CMD, argc, argv, &i))) return 1;
        else if (!strcmp(a, "--tokenizer") && !(file = cli_value(CMD, argc, argv, &i))) return 1;
        else if (!strcmp(a, "--text") && !(text = cli_value(CMD, argc, argv, &i))) return 1;
        else if (!strcmp(a, "--file") && !(input = cli_value(CMD, argc, argv, &i))) return 1;
        else if (!strcmp(a, "--lines")) lines = 1;
        else if (!strcmp(a, "--jsonl")) jsonl = 1;
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--plain")) plain = 1;
        else if (strcmp(a, "-m") && strcmp(a, "--tokenizer") && strcmp(a, "--text") && strcmp(a, "--file"))
            return cli_error(CMD, "unknown option '%s'", a);
    }
    if (!!dir + !!file != 1) return cli_error(CMD, "give exactly one of -m DIR or --tokenizer FILE");
    if (!!text + !!input != 1) return cli_error(CMD, "give exactly one of --text T or --file F");

    char *buf = NULL;
    size_t n;
    dsv4_error err;
    if (input) {
        if (dsv4_read_file(input, &buf, &n, &err)) return cli_fail(CMD, &err);
    } else {
        n = strlen(text);
    }
    const char *src = input ? buf : text;

    dsv4_tokenizer *t;
    int rc = dir ? dsv4_tokenizer_load_dir(dir, &t, &err) : dsv4_tokenizer_load_file(file, &t, &err);
    if (rc) { free(buf); return cli_fail(CMD, &err); }
    int flags = (plain ? DSV4_ENCODE_PLAIN : 0) | (dsv4_tokenizer_add_bos(t) ? DSV4_ENCODE_ADD_BOS : 0);

    dsv4_strbuf out;
    dsv4_sb_init(&out);
    rc = 0;
    if (lines || jsonl) {
        size_t start = 0, lineno = 1;
        while (start < n && !rc) {
            const char *nl = memchr(src + start, '\n', n - start);
            size_t end = nl ? (size_t)(nl - src) : n;
            rc = do_line(t, src + start, end - start, decode, jsonl, flags, lineno++, &out);
            dsv4_sb_putc(&out, '\n');
            start = end + 1;
        }
    } else if (decode) {
        rc = decode_one(t, src, n, 0, &out);
    } else {
        rc = encode_one(t, src, n, flags, &out);
        dsv4_sb_putc(&out, '\n');
    }
    if (!rc && out.oom) rc = cli_error(CMD, "out of memory");
    if (!rc && out.len && fwrite(out.data, 1, out.len, stdout) != out.len) rc = cli_error(CMD, "write error: %s", strerror(errno));
    dsv4_sb_free(&out);
    dsv4_tokenizer_free(t);
    free(buf);
    return rc;
}
