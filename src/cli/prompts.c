/* Prompt files for the commands that take many prompts (generate --batch, profile). */
#include "cli/cli.h"
#include "cli/prompts.h"
#include "util/fileio.h"
#include <stdlib.h>
#include <string.h>

/* A line of only digits, commas and blanks is a token list; anything else is text for the tokenizer. */
static int is_token_line(const char *line) {
    for (const char *p = line; *p; p++)
        if (!((*p >= '0' && *p <= '9') || *p == ',' || *p == ' ' || *p == '\t' || *p == '\r')) return 0;
    return 1;
}

void cli_prompts_free(cli_prompts *pl) {
    for (int i = 0; i < pl->n; i++) free(pl->tok[i]);
    free(pl->tok);
    free(pl->len);
}

int cli_read_prompts(const char *cmd, const char *path, const char *model_dir, dsv4_tokenizer **tok, cli_prompts *pl) {
    dsv4_error err;
    char *text = NULL;
    if (dsv4_read_file(path, &text, NULL, &err)) return cli_fail(cmd, &err);
    int rc = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && !rc; line = strtok_r(NULL, "\n", &save)) {
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r') line[--n] = 0;
        if (!n) continue;
        if (pl->n == pl->cap) {
            pl->cap = pl->cap ? 2 * pl->cap : 16;
            int32_t **nt = realloc(pl->tok, sizeof *nt * (size_t)pl->cap);
            if (nt) pl->tok = nt;
            int *nl = realloc(pl->len, sizeof *nl * (size_t)pl->cap);
            if (nl) pl->len = nl;
            if (!nt || !nl) { rc = cli_error(cmd, "out of memory"); break; }
        }
        int32_t *ids = NULL;
        int len = 0;
        if (is_token_line(line)) {
            if (cli_parse_tokens(cmd, line, &ids, &len)) { rc = 1; break; }
        } else {
            if (!*tok && dsv4_tokenizer_load_dir(model_dir, tok, &err)) {
                *tok = NULL;
                rc = cli_error(cmd, "%s line %d is text, which needs a tokenizer: %s", path, pl->n, err.msg);
                break;
            }
            size_t nn = 0;
            if (dsv4_tokenizer_encode(*tok, line, n, 0, &ids, &nn, &err)) { rc = cli_fail(cmd, &err); break; }
            len = (int)nn;
        }
        if (len == 0) { free(ids); rc = cli_error(cmd, "%s: prompt %d has no tokens", path, pl->n); break; }
        pl->tok[pl->n] = ids;
        pl->len[pl->n++] = len;
    }
    if (!rc && pl->n == 0) rc = cli_error(cmd, "%s: no prompts", path);
    free(text);
    return rc;
}

