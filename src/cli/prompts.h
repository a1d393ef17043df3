/* Prompt files: one prompt per non-empty line (numbered from 0 in file order, as `dsv4 logits --batch`); a line
 * of only digits, commas and blanks is a token list, any other line is text for the checkpoint's tokenizer. */
#ifndef DSV4_CLI_PROMPTS_H
#define DSV4_CLI_PROMPTS_H
#include "text/tokenizer.h"
#include <stdint.h>

typedef struct {
    int32_t **tok;   /* [n] token ids of each prompt, owned */
    int *len;        /* [n] */
    int n, cap;
} cli_prompts;

/* Read path into pl (zero-initialised by the caller). Text lines load the tokenizer of model_dir into *tok on
 * first use (the caller frees it). 0, or 1 after printing a one-line error for cmd. */
int  cli_read_prompts(const char *cmd, const char *path, const char *model_dir, dsv4_tokenizer **tok, cli_prompts *pl);
void cli_prompts_free(cli_prompts *pl);
#endif
