/* The vocabulary side of constrained decoding (internal to constraint*.c): every token that may appear in
 * constrained output as its byte string, in a trie laid out in preorder so that a mask is one forward pass over
 * arrays (node i's subtree is i .. end[i]-1; a dead prefix skips its subtree in one jump).
 *
 * For the shared walks of constraint_sig.c, the nodes of depth 1 .. CV_SIG_DEPTH are also listed by depth (in
 * preorder within a depth), and len_le[d] is the set of tokens of at most d bytes. For the closed forms of
 * constraint_count.c, each token's set of bytes (a token made of one byte class's bytes is found without a
 * walk) and its place in toks. */
#ifndef DSV4_ENGINE_CONSTRAINT_VOCAB_H
#define DSV4_ENGINE_CONSTRAINT_VOCAB_H
#include "engine/constraint.h"

#define CV_SIG_DEPTH 16          /* the deepest layer listed by depth (the depth of a behaviour signature) */

struct dsv4_cvocab {
    int32_t n_vocab, eos;
    const char **bytes;      /* [n_vocab]: token bytes (into pool), NULL = never allowed */
    uint32_t *len;           /* [n_vocab] */
    char *pool;
    /* trie, node 0 = the empty prefix */
    int32_t n_node;
    uint8_t *byte;           /* [n_node]: the byte on the edge into the node */
    uint16_t *depth;         /* [n_node] */
    int32_t *end;            /* [n_node]: first node after the subtree */
    int32_t *tok_first;      /* [n_node + 1]: tokens ending at node i are toks[tok_first[i] .. tok_first[i+1]) */
    int32_t *toks;
    int max_depth;
    int32_t depth_first[CV_SIG_DEPTH + 2]; /* nodes of depth d: depth_nodes[depth_first[d] .. depth_first[d + 1]) */
    int32_t *depth_nodes;
    uint64_t *len_le;        /* [(CV_SIG_DEPTH + 1) * words]: bit id of row d = token id has 1 .. d bytes */
    uint64_t *has_byte;      /* [(256 + 3) * words]: bit id of row b = token id contains byte b (constraint_count.c);
                              * rows 256, 257, 258: it contains some byte >= 0x80, some control byte (< 0x20 or
                              * 0x7F), any byte */
    int32_t *tok_index;      /* [n_vocab]: k with toks[k] == id; -1 when not in the trie */
    struct sig_shelf *shelf; /* stored walks made once for every matcher (dsv4_cvocab_prepare_json); read-only */
    struct count_shelf *count_shelf; /* tables of JSON's string and key characters (constraint_count.c); read-only */
    /* special (added) tokens by text, for grammars that name them (GE_TOKEN); never in the trie */
    char **special_text;
    int32_t *special_id;
    int32_t n_special, cap_special;
};
void sig_shelf_free(struct sig_shelf *sh);   /* constraint_sig.c */
void count_shelf_free(struct count_shelf *sh);   /* constraint_count.c */
int  count_prepare_json(dsv4_cvocab *v, dsv4_error *err);
#endif
