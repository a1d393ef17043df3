#include "model/expert_profile.h"
#include "util/error.h"
#include "util/fileio.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

int expert_profile_init(expert_profile *p, int n_layers, int n_routed, dsv4_error *err) {
    memset(p, 0, sizeof *p);
    if (n_layers < 1 || n_routed < 1) return dsv4_fail(err, DSV4_E_ARG, "an expert profile needs layers and experts");
    p->counts = calloc((size_t)n_layers * (size_t)n_routed, sizeof *p->counts);
    if (!p->counts) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    p->n_layers = n_layers;
    p->n_routed = n_routed;
    return DSV4_OK;
}

void expert_profile_free(expert_profile *p) {
    free(p->counts);
    memset(p, 0, sizeof *p);
}

int expert_profile_save(const expert_profile *p, const char *path, dsv4_error *err) {
    json_t *root = json_object(), *layers = json_array();
    int bad = !root || !layers;
    for (int l = 0; l < p->n_layers && !bad; l++) {
        json_t *row = json_array();
        bad = !row;
        for (int e = 0; e < p->n_routed && !bad; e++)
            bad = json_array_append_new(row, json_integer((json_int_t)p->counts[(size_t)l * p->n_routed + e])) != 0;
        bad = bad || json_array_append_new(layers, row) != 0;
    }
    if (!bad) {
        bad = json_object_set_new(root, "dsv4_expert_profile", json_integer(1)) ||
              json_object_set_new(root, "n_layers", json_integer(p->n_layers)) ||
              json_object_set_new(root, "n_routed", json_integer(p->n_routed)) ||
              json_object_set_new(root, "tokens", json_integer((json_int_t)p->tokens)) ||
              json_object_set_new(root, "counts", layers);
        layers = NULL;   /* owned by root now, whatever happened */
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(layers);
    json_decref(root);
    if (!text) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    const size_t n = strlen(text);
    int rc = dsv4_write_file_atomic(path, text, n, err);
    free(text);
    return rc;
}

/* A count that fits what a profile can hold: a non-negative JSON integer. */
static int read_count(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

int expert_profile_parse(const char *text, size_t len, const char *name, int n_layers, int n_routed, int top_k,
                         expert_profile *p, dsv4_error *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return dsv4_fail(err, DSV4_E_FORMAT, "%s: not JSON (line %d: %s)", name, je.line, je.text);
    int rc = DSV4_OK;
    json_t *tag = json_object_get(root, "dsv4_expert_profile"), *counts = json_object_get(root, "counts");
    uint64_t L = 0, E = 0, tokens = 0;
    if (!json_is_object(root) || !json_is_integer(tag))
        rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: not an expert profile (written by `dsv4 profile`)", name);
    else if (json_integer_value(tag) != 1)
        rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: expert profile version %lld, this build reads version 1", name,
                       (long long)json_integer_value(tag));
    else if (!read_count(json_object_get(root, "n_layers"), &L) || !read_count(json_object_get(root, "n_routed"), &E) ||
             !read_count(json_object_get(root, "tokens"), &tokens))
        rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: n_layers, n_routed and tokens must be non-negative integers", name);
    else if (L != (uint64_t)n_layers || E != (uint64_t)n_routed)
        rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: a profile of %llu layers x %llu experts, the model has %d x %d", name,
                       (unsigned long long)L, (unsigned long long)E, n_layers, n_routed);
    else if (!json_is_array(counts) || json_array_size(counts) != L)
        rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: counts must be an array of %d layers", name, n_layers);
    expert_profile q = {0};
    if (!rc) rc = expert_profile_init(&q, n_layers, n_routed, err);
    for (int l = 0; l < n_layers && !rc; l++) {
        json_t *row = json_array_get(counts, (size_t)l);
        if (!json_is_array(row) || json_array_size(row) != E) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: counts[%d] must be an array of %d integers", name, l, n_routed);
            break;
        }
        /* a layer's counts add up to at most top_k choices per token: more is a damaged (or foreign) file */
        uint64_t sum = 0;
        for (int e = 0; e < n_routed && !rc; e++) {
            uint64_t *c = &q.counts[(size_t)l * n_routed + e];
            if (!read_count(json_array_get(row, (size_t)e), c) || *c > tokens)
                rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: counts[%d][%d] must be an integer from 0 to tokens (%llu)", name,
                               l, e, (unsigned long long)tokens);
            else sum = *c > UINT64_MAX - sum ? UINT64_MAX : sum + *c;   /* saturating: a huge file is refused below */
        }
        if (!rc && top_k > 0 && sum / (uint64_t)top_k + (sum % (uint64_t)top_k != 0) > tokens)
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: layer %d counts %llu choices, more than %llu tokens x top-%d", name, l,
                           (unsigned long long)sum, (unsigned long long)tokens, top_k);
    }
    json_decref(root);
    if (rc) {
        expert_profile_free(&q);
        return rc;
    }
    q.tokens = tokens;
    *p = q;
    return DSV4_OK;
}

int expert_profile_load(const char *path, int n_layers, int n_routed, int top_k, expert_profile *p, dsv4_error *err) {
    char *text;
    size_t len;
    int rc = dsv4_read_file(path, &text, &len, err);
    if (rc) return rc;
    rc = expert_profile_parse(text, len, path, n_layers, n_routed, top_k, p, err);
    free(text);
    return rc;
}

int expert_profile_find(const char *dir, const char *path, int n_layers, int n_routed, int top_k, expert_profile *p,
                        dsv4_error *err) {
    memset(p, 0, sizeof *p);
    if (path && !*path) return DSV4_OK;
    char auto_path[4096];
    if (!path) {
        snprintf(auto_path, sizeof auto_path, "%s/%s", dir, EXPERT_PROFILE_FILE);
        if (access(auto_path, F_OK)) return DSV4_OK;
        path = auto_path;
    }
    return expert_profile_load(path, n_layers, n_routed, top_k, p, err);
}
