/* The matcher's automaton (internal to constraint*.c): parse stacks as a graph-structured stack, configurations,
 * and byte transitions between them. constraint.c builds masks on top of it.
 *
 * Stacks. A stack is a list of grammar positions: the top is the next element to match, each frame below is
 * where to continue in the calling rule. An interned node is (position, parent) where the parent is
 *   a node id (>= 0)          one frame below,
 *   PA_BOTTOM                 nothing below: the end of this alternative is the end of the output,
 *   PA_WILD                   "some context" (the cut-off part of a truncated configuration, constraint.c),
 *   PA_SET0 - k (<= PA_SET0)  the interned parent set k: several frames below (alternatives not yet told apart).
 * So a node stands for a set of stacks, nodes share what is below them, and equal sets of stacks built the same
 * way are the same integer. A reference in tail position pushes no frame (it returns straight to the caller's
 * continuation), so right-recursive loops such as the characters of a string run in constant depth and come back
 * to the very same node.
 *
 * Why parent sets (a graph-structured stack, as in GLR/Earley parsing): with one parent per node, an ambiguous
 * recursive grammar such as `root ::= word (root " " word){0,3} "."` (where a run of letters can be split into
 * nested words anywhere) has a number of distinct stacks exponential in the output length, and every one was
 * expanded on its own (seconds per 64-byte walk). The closure below merges every stack with the same top
 * position into one node per step, so a step costs time polynomial in the grammar and the output so far.
 *
 * Configurations. After some output the automaton is in a set of "ready" nodes (top = a byte set or a special
 * token) plus two
 * flags: accept (the whole output may end here) and escape (a stack left its truncated frames). Interned too,
 * so a stream's position is (configuration id, bytes used) and rollback is an assignment; transitions
 * (configuration, byte) -> configuration are cached in the matcher. */
#ifndef DSV4_ENGINE_CONSTRAINT_PDA_H
#define DSV4_ENGINE_CONSTRAINT_PDA_H
#include "engine/constraint_vocab.h"

#define PA_BOTTOM (-1)
#define PA_WILD (-2)
#define PA_SET0 (-3)
#define MAX_CONFIGS (1 << 22)    /* beyond this the matcher reports out of memory rather than growing on */
#define T_UNKNOWN (-2)           /* transition results: not computed yet, */
#define T_FAIL (-3)              /* out of memory (or a table limit), */
#define T_BUDGET (-4)            /* the token fits the grammar but not the length bound */
#define MASK_SLOTS 256           /* cached masks per matcher (16 KB each on a 129k vocabulary) */
#define CI_SLOTS 64

typedef struct { int32_t pos, parent; } cnode;
typedef struct sig_store sig_store;      /* behaviour signatures and their shared walks (constraint_sig.c) */
typedef struct count_state count_state;  /* counted repetitions (constraint_count.c) */
typedef struct { int32_t *v; int64_t n, cap; } ivec;

int ivec_push(ivec *a, int32_t x);

/* A table of interned int32 lists: list k is v[off[k] .. off[k] + len[k]). */
typedef struct {
    ivec v;
    int64_t *off;
    int32_t *len;
    uint8_t *tag;        /* part of the key (a configuration's flags) */
    int32_t n, cap;
    int32_t *h;          /* open addressing: list ids, -1 = empty */
    uint32_t h_cap;
} ilists;

struct dsv4_cmatcher {
    const dsv4_grammar *g;
    const dsv4_cvocab *v;
    int32_t start;               /* the configuration before any output */
    uint8_t byte_rep[256];       /* the smallest byte every byte set of the grammar treats like this one */
    /* interned stack nodes */
    cnode *node;
    int64_t *node_min;           /* fewest bytes that complete every stack of the node (the minimum over them) */
    uint32_t *node_seen;         /* stamp / value scratch for truncation */
    int32_t *node_map;
    int32_t n_node, cap_node;
    int32_t *nh;                 /* open addressing: node ids, -1 = empty */
    uint32_t nh_cap;
    /* interned parent sets (sorted, at least two members) and their completion minimum */
    ilists ps;
    int64_t *ps_min;
    /* interned configurations: cfgs list c = the ready nodes, sorted; flags in the hash key */
    ilists cf;
    uint8_t *cfg_accept;
    uint8_t *cfg_escape;         /* a stack left its truncated frames here (truncated configurations only) */
    int32_t *cfg_ci;             /* truncated configurations: context-independent walk slot, or -1 */
    int64_t *cfg_min;
    int32_t **cfg_trans;         /* [256] per configuration, allocated on first use */
    int32_t **cfg_strans;        /* [n_special] per configuration: transitions on the grammar's special tokens */
    int32_t *special_id;         /* [g->n_special]: the vocabulary id of each special token the grammar names */
    int32_t *cfg_slot;           /* mask cache slot or -1 */
    int64_t n_trans_tables;      /* transition tables allocated (1 KB each) */
    /* closure scratch, per grammar position (constraint_pda.c) */
    uint32_t gen;
    uint32_t *it_gen;            /* [n_el]: the item at this position belongs to closure `gen` */
    int32_t *it_head, *it_tail, *it_done; /* its reference list in rv/rn; the last reference propagated (-1 none) */
    uint8_t *it_flag;
    int32_t *it_node;            /* resolved frame node (position + 1 above this item's references) */
    ivec rv, rn;                 /* reference pool: value, next */
    uint64_t *dk;                /* (position, reference) pairs seen in this closure */
    uint32_t *dg;
    uint32_t d_cap, d_n;
    ivec work, ready, acc, tmp;
    uint32_t stamp;
    /* mask cache (constraint.c) */
    int words;
    uint64_t *pool;              /* [MASK_SLOTS][words] */
    int32_t slot_cfg[MASK_SLOTS];
    int64_t slot_need[MASK_SLOTS];
    int next_slot;
    uint64_t *bits;              /* [words] scratch */
    uint64_t *ci_bits;           /* [CI_SLOTS][words]: allowed whatever the context */
    int32_t *ci_ranges[CI_SLOTS];/* uncertain tokens: pairs [a, b) of indexes into the vocabulary's toks */
    int ci_n_ranges[CI_SLOTS], ci_cap_ranges[CI_SLOTS];
    int64_t ci_uncertain[CI_SLOTS], ci_need[CI_SLOTS];
    int32_t ci_cfg[CI_SLOTS];
    /* a slot filled by a closed form (constraint_count.c): its table and shape, for budgets below its need */
    const struct count_table *ci_ct[CI_SLOTS];
    int64_t ci_ct_p[CI_SLOTS], ci_ct_xmin[CI_SLOTS], ci_ct_kmin[CI_SLOTS];
    int next_ci;
    uint8_t *esc;                /* [max_depth + 1] walk scratch */
    int32_t *dfs;                /* [max_depth + 1] */
    count_state *cnt;            /* counted repetitions and their tables (constraint_count.c), made on first use */
    sig_store *sig;              /* walks shared by configurations that behave alike (constraint_sig.c) */
    int64_t sig_probe;           /* trie nodes a plain walk may visit before a stored walk is tried (tests: 0) */
    dsv4_cstate_stats st;
};

/* Set up / release the automaton part of m (m->g and m->v set, m->special_id resolved, the rest zero).
 * pda_init builds m->start. */
int  pda_init(dsv4_cmatcher *m);
void pda_free(dsv4_cmatcher *m);
size_t pda_bytes(const dsv4_cmatcher *m);

/* The configuration after reading byte b in configuration c: -1 dead, T_FAIL out of memory. */
int32_t pda_step_byte(dsv4_cmatcher *m, int32_t c, unsigned b);
/* The same for the grammar's special token k (an index into g->special). */
int32_t pda_step_special(dsv4_cmatcher *m, int32_t c, int32_t k);

/* The closure of the items pos[0 .. n) with the frames of parent code `parent` (a node id or PA_WILD), interned:
 * its id, or T_FAIL. */
int32_t pda_enter(dsv4_cmatcher *m, const int32_t *pos, int32_t n, int32_t parent);

/* c with its shared context cut off (constraint.c explains the use): the innermost node that every stack of c
 * passes through gets the parent PA_WILD, and the nodes above it are rebuilt on it, so configurations that
 * differ only below that node (a string in one property or another) truncate to the same configuration.
 * *ccut = the fewest bytes that complete the cut-off context. Returns the truncated configuration (c itself
 * when its stacks share no node), or T_FAIL. */
int32_t pda_truncate(dsv4_cmatcher *m, int32_t c, int64_t *ccut);

/* Context-independent walks (constraint_sig.c): the walk of truncated configuration tc (the truncation of c)
 * into CI slot `slot` (ci_bits, ci_ranges, ci_uncertain, ci_need). A wide configuration may get a closed form
 * (count_fill) there instead: of tc, or of c itself, which *key then says (else it is tc). 0, or -1 when out of
 * memory. */
int  sig_init(dsv4_cmatcher *m);
void sig_free(dsv4_cmatcher *m);
size_t sig_bytes(const dsv4_cmatcher *m);
int  ci_fill(dsv4_cmatcher *m, int32_t tc, int32_t c, int slot, int32_t *key);
/* Uncertain tokens toks[a .. b) into CI slot `slot`. 0, or -1 when out of memory. */
int  ci_add_range(dsv4_cmatcher *m, int slot, int32_t a, int32_t b);

/* Closed forms of counted repetitions (constraint_count.c): the context-independent walk of configuration tc
 * (truncated, or a real one: then the answer holds for it alone) into CI slot `slot` without walking the trie,
 * when tc is the start of an x of a counted repetition whose x has a table (the vocabulary's; or, with build,
 * made now, once per x). 1 done, 0 not that form, -1 out of memory. */
int  count_fill(dsv4_cmatcher *m, int32_t tc, int slot, int build);
/* The same for a real configuration c one byte before such a start, when every byte c reads leads to it and is
 * an x of the repetition by itself (the last byte of a GBNF literal, a space, before [a-zA-Z ,']{1,300}): a
 * token b u reads from c as u from the start, with one x more. Builds the table when needed. */
int  count_fill_after_byte(dsv4_cmatcher *m, int32_t c, int slot);
/* The allowed part of a closed form's slot under a budget below its need: the slot's allowed tokens whose length
 * plus the shortest completion after them fits `left` (the budget less the truncation's cut), into bits;
 * *cut = 1 when one did not fit, *need = left (the mask holds from there up when nothing was cut). Exact: after
 * such a token only its x's stack is alive, and its shortest completion is the rest of the x, the mandatory x's
 * left and K's. 0, or -1 out of memory. */
int  count_budget(dsv4_cmatcher *m, int slot, int64_t left, uint64_t *bits, int64_t *need, int *cut);
void count_free(dsv4_cmatcher *m);
size_t count_bytes(const dsv4_cmatcher *m);

static inline int32_t cfg_len(const dsv4_cmatcher *m, int32_t c) { return m->cf.len[c]; }
static inline const int32_t *cfg_items(const dsv4_cmatcher *m, int32_t c) { return m->cf.v.v + m->cf.off[c]; }
#endif
