/* Constrained-output options: see gen_constraint.h. */
#include "cli/gen_constraint.h"
#include "cli/cli.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/fileio.h"
#include <stdlib.h>
#include <string.h>

int cli_constraint_option(const char *cmd, int argc, char **argv, int *i, cli_constraint_opts *o) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--json")) { o->json = 1; return 1; }
    if (!strcmp(a, "--json-schema")) { if (!(v = cli_value(cmd, argc, argv, i))) return -1; o->schema_file = v; return 1; }
    if (!strcmp(a, "--grammar")) { if (!(v = cli_value(cmd, argc, argv, i))) return -1; o->grammar_file = v; return 1; }
    if (!strcmp(a, "--json-ws")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || cli_parse_int(cmd, a, v, 0, 64, &o->ws)) return -1;
        return 1;
    }
    return 0;
}

int cli_constraint_wanted(const char *cmd, const cli_constraint_opts *o) {
    const int n = !!o->json + !!o->schema_file + !!o->grammar_file;
    if (n > 1) { cli_error(cmd, "give at most one of --json-schema, --json and --grammar"); return -1; }
    if (!n && o->ws >= 0) { cli_error(cmd, "--json-ws needs --json-schema or --json"); return -1; }
    return n;
}

int cli_constraint_build(const char *cmd, const cli_constraint_opts *o, const char *model_dir, int32_t n_vocab, int32_t eos,
                         dsv4_grammar **g, dsv4_cvocab **v) {
    dsv4_error err;
    *g = NULL;
    *v = NULL;
    const dsv4_schema_opts so = { o->ws >= 0 ? (int)o->ws : DSV4_SCHEMA_DEFAULT_WS };
    char *text = NULL;
    size_t n = 0;
    const char *file = o->schema_file ? o->schema_file : o->grammar_file;
    if (file && dsv4_read_file(file, &text, &n, &err)) return cli_fail(cmd, &err);
    int rc = o->json ? dsv4_grammar_json_any(&so, g, &err)
           : o->schema_file ? dsv4_grammar_from_schema_text(text, n, &so, g, &err)
           : dsv4_grammar_from_gbnf(text, n, g, &err);
    free(text);
    if (rc) {
        dsv4_wrap(&err, "%s", file ? file : "--json");
        return cli_fail(cmd, &err);
    }
    dsv4_tokenizer *tok = NULL;
    if (dsv4_tokenizer_load_dir(model_dir, &tok, &err)) {
        dsv4_grammar_free(*g);
        *g = NULL;
        return cli_error(cmd, "constrained output needs the checkpoint's tokenizer: %s", err.msg);
    }
    rc = dsv4_cvocab_from_tokenizer(tok, n_vocab, eos, v, &err);
    dsv4_tokenizer_free(tok);
    if (rc) {
        dsv4_grammar_free(*g);
        *g = NULL;
        return cli_fail(cmd, &err);
    }
    return 0;
}
