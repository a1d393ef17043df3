/* The table of an x of a counted repetition (constraint_count.c): how every token of the vocabulary reads as
 * x content, made once per x and vocabulary, whatever the frames around the x.
 *
 * Let S be the configuration of x started with nothing below it (its frame is the wildcard). Reading a token's
 * bytes from S, and going back to S each time an x is complete (the configuration escaped, with nothing else
 * alive: x must be prefix-free, or there is no table), classifies it:
 *   pure:  all its bytes are x content; c = the x's started (the last one maybe unfinished, `rest` bytes from
 *          complete);
 *   break: after j complete x's the next byte b cannot start an x;
 *   dead:  it stops inside an x.
 * That is one walk of the trie (pure prefixes and their children only). An x that is one byte of a set (a
 * character class of single bytes: GBNF and pattern classes) needs no walk: the pure tokens are those whose
 * bytes are all in the set (the vocabulary's per-byte token sets, constraint_vocab.h), c is their length, and
 * the breaks at a byte are found when a mask first needs them.
 *
 * Owned by whoever made it (a matcher, or the vocabulary for JSON's string and key characters); a table made
 * with lazy breaks is mutable like its matcher, the vocabulary's are complete and read-only. */
#ifndef DSV4_ENGINE_CONSTRAINT_COUNT_TABLE_H
#define DSV4_ENGINE_CONSTRAINT_COUNT_TABLE_H
#include "engine/constraint_pda.h"

#define CT_ROWS 17                  /* rows of allowed bits for c = 0 .. 16; longer counts from a sorted list */

typedef struct count_table {
    int words;
    int32_t n_vocab;
    gb_set first_x;                 /* bytes that start an x */
    int32_t maxc;                   /* the largest c of a pure token */
    uint64_t *pure_le;              /* [CT_ROWS][words]: pure tokens with c <= row */
    uint64_t *pure_all;             /* [words] */
    int64_t mlr[CT_ROWS], mlr_all;  /* max (length + rest) over those */
    int32_t n_tail;                 /* pure tokens with c >= CT_ROWS, sorted by c */
    int32_t *tail_id, *tail_c;
    int64_t *tail_mlr;              /* cumulative max of length + rest along the tail */
    int32_t n_brk;                  /* break entries sorted by (byte, j): toks[ka .. kb) broke at j with byte */
    int32_t brk_first[257];
    int32_t *brk_j, *brk_ka, *brk_kb;
    /* x is one byte of a set (a character class of single bytes): the table is made from the vocabulary's byte
     * sets without a walk (c = the length), and the breaks at byte b are found when first needed (matchers'
     * own tables only: the vocabulary's are read-only) */
    int bytes_only;
    gb_set set;
    uint8_t b_done[256];
    int32_t b_n[256];
    int32_t *b_j[256], *b_k[256];   /* sorted by j: toks[k] is x-content for j bytes, then byte b */
    /* per token (walk tables; single-byte ones: c = the length, rest 0): c, and the bytes that finish its last x */
    uint16_t *tok_c;
    uint8_t *tok_rest;
    /* the pure tokens by length + rest, longest first (single-byte tables: made when first needed) */
    int32_t n_by_lr;
    int32_t *by_lr_id, *by_lr;
} count_table;

/* The table of rule x of m's grammar, on m's automaton; lazy_ok: a single-byte x gets its table from the
 * vocabulary's byte sets and its breaks later (count_table_breaks), else every table is made whole by the walk.
 * 1 made (*out, the caller's), 0 x has none (nullable, or not prefix-free), -1 out of memory. */
int  count_table_build(dsv4_cmatcher *m, int32_t x, int lazy_ok, count_table **out);
/* The breaks at byte b of a lazily made table (b_*[b]), made when first asked for. 0, or -1 out of memory. */
int  count_table_breaks(const dsv4_cvocab *v, count_table *t, unsigned b);
/* The pure tokens by length + rest (by_lr_*), made when first asked for. 0, or -1 out of memory. */
int  count_table_by_length(const dsv4_cvocab *v, count_table *t);
void count_table_free(count_table *t);
size_t count_table_bytes(const count_table *t);
#endif
