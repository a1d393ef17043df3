/* Constrained-output options of dsv4 generate (--json-schema FILE | --json | --grammar FILE, --json-ws N):
 * parsing and building the grammar and the vocabulary the engine's constraint API needs (constraint.h). */
#ifndef DSV4_CLI_GEN_CONSTRAINT_H
#define DSV4_CLI_GEN_CONSTRAINT_H
#include "engine/constraint.h"

typedef struct {
    const char *schema_file, *grammar_file;
    int json;
    long long ws;            /* -1 = default */
} cli_constraint_opts;

/* 1 when argv[*i] is one of the options (consumed into o), 0 when not, -1 after printing an error. */
int cli_constraint_option(const char *cmd, int argc, char **argv, int *i, cli_constraint_opts *o);
/* 1 when a constraint was asked for; checks that at most one form was given (prints an error, returns -1). */
int cli_constraint_wanted(const char *cmd, const cli_constraint_opts *o);
/* Compile the grammar and build the vocabulary from the checkpoint's tokenizer (model_dir/tokenizer.json) for a
 * model with n_vocab tokens and end-of-sequence eos. Prints the error and returns 1 on failure. */
int cli_constraint_build(const char *cmd, const cli_constraint_opts *o, const char *model_dir, int32_t n_vocab, int32_t eos,
                         dsv4_grammar **g, dsv4_cvocab **v);
#endif
