/* Pre-tokenizer: a chain of HF `Split` steps with behavior "Isolated", each a regex run by PCRE2 in UTF + UCP mode.
 * Step k+1 runs separately inside every piece step k produced, so no later step sees across an earlier boundary;
 * both matches and the unmatched gaps between them become pieces (nothing is dropped).
 *
 * Tokenizer files are written for Oniguruma (what HF tokenizers uses). The one semantic difference that matters
 * for the DeepSeek / GPT-style patterns is `\s`: Oniguruma's is Unicode White_Space, PCRE2's UCP `\s` also
 * accepts U+180E. Patterns are therefore rewritten so `\s` / `\S` name the White_Space set explicitly. */
#ifndef DSV4_TEXT_PRETOK_H
#define DSV4_TEXT_PRETOK_H
#include "dsv4.h"
#include <stddef.h>

typedef struct dsv4_pretok dsv4_pretok;

int  dsv4_pretok_new(dsv4_pretok **out, dsv4_error *err);
void dsv4_pretok_free(dsv4_pretok *p);
/* Append a Split step (Oniguruma-syntax pattern, behavior Isolated). */
int  dsv4_pretok_add_split(dsv4_pretok *p, const char *pattern, dsv4_error *err);
int  dsv4_pretok_count(const dsv4_pretok *p);

/* Called for every final piece, in order. Return non-zero to stop (that value is returned by run). */
typedef int (*dsv4_piece_fn)(void *ud, const char *s, size_t n);

/* Split text (valid UTF-8; the caller checks) and call fn for each piece. With no steps, text is one piece.
 * Returns 0, fn's non-zero value, or a dsv4_status on a regex engine failure. */
int dsv4_pretok_run(const dsv4_pretok *p, const char *text, size_t n, dsv4_piece_fn fn, void *ud,
                    dsv4_error *err);
#endif
