/* Independent validator for tests: see mini_validator.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "mini_validator.h"
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int no(char *why, size_t n, const char *msg, const char *arg) {
    snprintf(why, n, "%s%s%s", msg, arg ? " " : "", arg ? arg : "");
    return 0;
}

static const json_t *pointer(const json_t *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = root;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char seg[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof seg) {
            if (p[0] == '~' && p[1] == '1') { seg[k++] = '/'; p += 2; }
            else if (p[0] == '~' && p[1] == '0') { seg[k++] = '~'; p += 2; }
            else seg[k++] = *p++;
        }
        seg[k] = 0;
        cur = json_is_object(cur) ? json_object_get(cur, seg) : json_is_array(cur) ? json_array_get(cur, (size_t)atoi(seg)) : NULL;
    }
    return cur;
}

static int has_type(const json_t *v, const char *t) {
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    return 0;
}

/* code points of a UTF-8 string */
static size_t cp_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static int pattern_matches(const char *pat, const char *s, size_t n) {
    int e;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &e, &off, NULL);
    if (!re) return 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    const int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

int mv_valid(const json_t *root, const json_t *schema, const json_t *v, char *why, size_t n) {
    if (json_is_true(schema)) return 1;
    if (json_is_false(schema)) return no(why, n, "schema false", NULL);
    const json_t *k;
    if ((k = json_object_get(schema, "$ref"))) {
        const json_t *t = pointer(root, json_string_value(k));
        if (!t) return no(why, n, "dangling $ref", json_string_value(k));
        return mv_valid(root, t, v, why, n);
    }
    if ((k = json_object_get(schema, "type"))) {
        int ok = 0;
        if (json_is_string(k)) ok = has_type(v, json_string_value(k));
        else for (size_t i = 0; i < json_array_size(k); i++) ok |= has_type(v, json_string_value(json_array_get(k, i)));
        if (!ok) return no(why, n, "type", NULL);
    }
    if ((k = json_object_get(schema, "enum"))) {
        int ok = 0;
        for (size_t i = 0; i < json_array_size(k); i++) ok |= json_equal(json_array_get(k, i), (json_t *)v);
        if (!ok) return no(why, n, "enum", NULL);
    }
    if ((k = json_object_get(schema, "const")) && !json_equal((json_t *)k, (json_t *)v)) return no(why, n, "const", NULL);
    if ((k = json_object_get(schema, "anyOf"))) {
        int ok = 0;
        for (size_t i = 0; i < json_array_size(k); i++) ok |= mv_valid(root, json_array_get(k, i), v, why, n);
        if (!ok) return no(why, n, "anyOf", NULL);
    }
    if ((k = json_object_get(schema, "oneOf"))) {
        int c = 0;
        for (size_t i = 0; i < json_array_size(k); i++) c += mv_valid(root, json_array_get(k, i), v, why, n);
        if (c != 1) return no(why, n, "oneOf", NULL);
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(schema, "properties"), *addl = json_object_get(schema, "additionalProperties");
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v, key, val) {
            const json_t *ps = props ? json_object_get(props, key) : NULL;
            if (ps) { if (!mv_valid(root, ps, val, why, n)) return 0; }
            else if (addl && !mv_valid(root, addl, val, why, n)) return no(why, n, "additional property", key);
        }
        const json_t *req = json_object_get(schema, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i))))
                return no(why, n, "required", json_string_value(json_array_get(req, i)));
    }
    if (json_is_array(v)) {
        const json_t *pre = json_object_get(schema, "prefixItems"), *items = json_object_get(schema, "items");
        const size_t len = json_array_size(v);
        for (size_t i = 0; i < len; i++) {
            const json_t *s = i < json_array_size(pre) ? json_array_get(pre, i) : items;
            if (s && !mv_valid(root, s, json_array_get(v, i), why, n)) return 0;
        }
        if ((k = json_object_get(schema, "minItems")) && (json_int_t)len < json_integer_value(k)) return no(why, n, "minItems", NULL);
        if ((k = json_object_get(schema, "maxItems")) && (json_int_t)len > json_integer_value(k)) return no(why, n, "maxItems", NULL);
    }
    if (json_is_string(v)) {
        const size_t len = cp_len(json_string_value(v), json_string_length(v));
        if ((k = json_object_get(schema, "minLength")) && (json_int_t)len < json_integer_value(k)) return no(why, n, "minLength", NULL);
        if ((k = json_object_get(schema, "maxLength")) && (json_int_t)len > json_integer_value(k)) return no(why, n, "maxLength", NULL);
        if ((k = json_object_get(schema, "pattern")) && !pattern_matches(json_string_value(k), json_string_value(v), json_string_length(v)))
            return no(why, n, "pattern", json_string_value(k));
    }
    if (json_is_number(v)) {
        const double x = json_number_value(v);
        if ((k = json_object_get(schema, "minimum")) && x < json_number_value(k)) return no(why, n, "minimum", NULL);
        if ((k = json_object_get(schema, "maximum")) && x > json_number_value(k)) return no(why, n, "maximum", NULL);
        if ((k = json_object_get(schema, "exclusiveMinimum")) && x <= json_number_value(k)) return no(why, n, "exclusiveMinimum", NULL);
        if ((k = json_object_get(schema, "exclusiveMaximum")) && x >= json_number_value(k)) return no(why, n, "exclusiveMaximum", NULL);
    }
    return 1;
}
