#include "text/pyjson.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dsv4_pyjson_string(dsv4_strbuf *out, const char *s, size_t n) {
    dsv4_sb_putc(out, '"');
    dsv4_pyjson_escape(out, s, n);
    dsv4_sb_putc(out, '"');
}

void dsv4_pyjson_escape(dsv4_strbuf *out, const char *s, size_t n) {
    size_t run = 0;   /* start of the pending run of bytes that need no escaping */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char hex[8];
        switch (c) {
        case '"':  esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { snprintf(hex, sizeof hex, "\\u%04x", c); esc = hex; }
        }
        if (!esc) continue;
        dsv4_sb_append(out, s + run, i - run);
        dsv4_sb_puts(out, esc);
        run = i + 1;
    }
    dsv4_sb_append(out, s + run, n - run);
}

void dsv4_pyjson_float(dsv4_strbuf *out, double d) {
    if (isnan(d)) { dsv4_sb_puts(out, "NaN"); return; }
    if (isinf(d)) { dsv4_sb_puts(out, d > 0 ? "Infinity" : "-Infinity"); return; }
    /* Shortest digit string that reads back as the same double (what repr() does). */
    char buf[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    /* buf = [-]D.DDDDe[+-]XX: pull out the digits and the decimal exponent. */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = buf;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    if (neg) dsv4_sb_putc(out, '-');
    if (exp >= -5 + 1 && exp < 16) {
        /* Positional notation, always with a fractional part ("1.0", "0.001", "123.5"). */
        if (exp < 0) {
            dsv4_sb_puts(out, "0.");
            for (int i = 0; i < -exp - 1; i++) dsv4_sb_putc(out, '0');
            dsv4_sb_puts(out, digits);
        } else if (nd <= exp + 1) {
            dsv4_sb_puts(out, digits);
            for (int i = nd; i < exp + 1; i++) dsv4_sb_putc(out, '0');
            dsv4_sb_puts(out, ".0");
        } else {
            dsv4_sb_append(out, digits, (size_t)exp + 1);
            dsv4_sb_putc(out, '.');
            dsv4_sb_puts(out, digits + exp + 1);
        }
    } else {
        /* Scientific: "1e+16", "1.5e-07" (at least two exponent digits, explicit sign). */
        dsv4_sb_putc(out, digits[0]);
        if (nd > 1) { dsv4_sb_putc(out, '.'); dsv4_sb_puts(out, digits + 1); }
        dsv4_sb_printf(out, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

void dsv4_pyjson_dump(dsv4_strbuf *out, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        dsv4_sb_putc(out, '{');
        const char *k;
        json_t *x;
        int first = 1;
        /* json_object_foreach needs a non-const object; iteration does not modify it. */
        json_object_foreach((json_t *)v, k, x) {
            if (!first) dsv4_sb_puts(out, ", ");
            first = 0;
            dsv4_pyjson_string(out, k, strlen(k));
            dsv4_sb_puts(out, ": ");
            dsv4_pyjson_dump(out, x);
        }
        dsv4_sb_putc(out, '}');
        break;
    }
    case JSON_ARRAY: {
        dsv4_sb_putc(out, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) dsv4_sb_puts(out, ", ");
            dsv4_pyjson_dump(out, json_array_get(v, i));
        }
        dsv4_sb_putc(out, ']');
        break;
    }
    case JSON_STRING: dsv4_pyjson_string(out, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: dsv4_sb_printf(out, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: dsv4_pyjson_float(out, json_real_value(v)); break;
    case JSON_TRUE: dsv4_sb_puts(out, "true"); break;
    case JSON_FALSE: dsv4_sb_puts(out, "false"); break;
    case JSON_NULL: dsv4_sb_puts(out, "null"); break;
    }
}
