/* A context-free grammar over bytes: the common target of the JSON Schema compiler (json_schema.c), the pattern
 * compiler (json_pattern.c) and the GBNF parser (grammar.c), and the input of the constraint matcher
 * (constraint.c).
 *
 * A grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence of elements, each
 * a byte set (one byte out of a 256-bit set) or a reference to a rule. Characters are UTF-8: a character class
 * over code points becomes a rule whose alternatives are byte-set sequences (gb_class), so the matcher never
 * decodes UTF-8 and every accepted output is well-formed UTF-8 by construction.
 *
 * Building: a gb_builder collects rules; alternatives are assembled in a gb_seq (a growable element list the
 * caller owns) and copied in by gb_add_alt. gb_finish checks the grammar (every referenced rule defined, no left
 * recursion, every rule can finish) and computes the shortest completion in bytes from every position, which
 * the matcher uses to bound the output length. The finished dsv4_grammar is immutable and may be shared by any
 * number of streams and threads.
 *
 * Memory: a builder that runs out of memory remembers it (oom) and gb_finish reports DSV4_E_NOMEM, so building
 * code need not check every call. */
#ifndef DSV4_ENGINE_GRAMMAR_IR_H
#define DSV4_ENGINE_GRAMMAR_IR_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

/* GE_TOKEN: one whole special (added) token, named by its text (g->special[arg]); the matcher finds its id in
 * the vocabulary. Special tokens are never allowed anywhere else, and never spelled out in bytes. For the length
 * bound a special token counts as one byte (it is one token of the budget). */
enum { GE_END = 0, GE_BYTES = 1, GE_RULE = 2, GE_TOKEN = 3 };
typedef struct {
    int32_t kind;   /* GE_* */
    int32_t arg;    /* GE_BYTES: byte-set index; GE_RULE: rule id; GE_TOKEN: special-token index */
} gelem;

typedef struct { uint64_t w[4]; } gb_set;  /* 256-bit byte set */

static inline void gb_set_add(gb_set *s, unsigned b) { s->w[b >> 6] |= 1ULL << (b & 63); }
static inline int gb_set_has(const gb_set *s, unsigned b) { return (int)((s->w[b >> 6] >> (b & 63)) & 1); }

/* The finished grammar. Positions index el[]; every alternative ends with a GE_END element. */
typedef struct dsv4_grammar {
    gelem *el;
    int32_t n_el;
    int32_t n_rule;
    int32_t *alt_first;      /* [n_rule + 1]: rule r's alternatives are alt_pos[alt_first[r] .. alt_first[r+1]) */
    int32_t *alt_pos;        /* start position of each alternative */
    gb_set *sets;
    int32_t n_sets;
    int64_t *minrest;        /* [n_el]: fewest bytes that finish the alternative from this position */
    int64_t *rule_min;       /* [n_rule]: fewest bytes any expansion of the rule has */
    char **rule_name;        /* [n_rule] */
    int32_t root;
    char **special;          /* [n_special]: the texts of the special tokens the grammar names (GE_TOKEN) */
    int32_t n_special;
} dsv4_grammar;

void dsv4_grammar_free(dsv4_grammar *g);
/* A deep copy (NULL when out of memory). */
dsv4_grammar *dsv4_grammar_copy(const dsv4_grammar *g);
/* 1 when a and b are the same grammar element for element (rule names aside): the same schema compiles to the
 * same grammar, so this is what a cache of matchers is keyed by. dsv4_grammar_hash agrees with it. */
int dsv4_grammar_same(const dsv4_grammar *a, const dsv4_grammar *b);
uint64_t dsv4_grammar_hash(const dsv4_grammar *g);

/* ---- building ------------------------------------------------------------------------------------------ */

typedef struct gb_builder gb_builder;

typedef struct {
    gelem *v;
    int n, cap;
    int oom;
} gb_seq;

void gb_seq_init(gb_seq *s);
void gb_seq_free(gb_seq *s);
void gb_seq_clear(gb_seq *s);
void gb_seq_ref(gb_seq *s, int32_t rule);
void gb_seq_set(gb_seq *s, gb_builder *b, const gb_set *set);
void gb_seq_byte(gb_seq *s, gb_builder *b, unsigned char c);
void gb_seq_lit(gb_seq *s, gb_builder *b, const char *bytes, size_t n);
void gb_seq_append(gb_seq *s, const gb_seq *t);
/* One special (added) token, by its text (for example the DSML marker "｜DSML｜"). */
void gb_seq_special(gb_seq *s, gb_builder *b, const char *text);

gb_builder *gb_new(void);
void gb_free(gb_builder *b);
/* A new rule (name used in error messages; NULL or "" gives an anonymous name). Returns its id, -1 if out of
 * memory. A rule with no alternatives at gb_finish is an error unless never referenced. */
int32_t gb_rule(gb_builder *b, const char *name);
/* Id of the named rule, creating it (undefined) when new: for forward references. */
int32_t gb_rule_named(gb_builder *b, const char *name);
int gb_rule_defined(const gb_builder *b, int32_t rule);
const char *gb_rule_name(const gb_builder *b, int32_t rule);
void gb_add_alt(gb_builder *b, int32_t rule, const gb_seq *s);
/* A rule matching exactly the sequence (one alternative). */
int32_t gb_rule_of(gb_builder *b, const gb_seq *s);
/* x{min,max} of rule x (max < 0: unbounded) as a new rule. Counts are limited to GB_MAX_REPEAT. */
#define GB_MAX_REPEAT 100000
int32_t gb_repeat(gb_builder *b, int32_t x, int64_t min, int64_t max);
int gb_oom(const gb_builder *b);

/* Code-point ranges [lo, hi] (inclusive); a class is a list of them. */
typedef struct { uint32_t lo, hi; } gb_range;
/* A rule matching one UTF-8 character from the ranges (negate: every scalar value not in them). Surrogates are
 * never matched. Rules are shared between identical classes. Returns -1 if the class is empty or on no memory. */
int32_t gb_class(gb_builder *b, const gb_range *r, int n, int negate);

/* Check and freeze. The builder is consumed (freed) in every case. */
int gb_finish(gb_builder *b, int32_t root, dsv4_grammar **out, dsv4_error *err);
#endif
