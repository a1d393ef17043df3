/* Constrained decoding: the API a caller (dsv4 generate, the scheduler, speculative streams, the server) uses.
 *
 * Four objects:
 *   dsv4_grammar  what the output must match: compiled from a JSON Schema (json_schema.h), JSON mode (any JSON
 *                 value) or a GBNF-like grammar (grammar.h). Immutable once built; share it freely (any number
 *                 of streams and threads may read it).
 *   dsv4_cvocab   the model's vocabulary as byte strings, in a trie, plus the end-of-sequence id. Build once per
 *                 tokenizer/model; immutable; shared like the grammar.
 *   dsv4_cmatcher the automaton for one (grammar, vocabulary) pair: interned parse stacks and configurations,
 *                 transitions, token-mask caches. Its caches grow as streams use it; streams that share a matcher
 *                 share all that work (the second request with a schema finds its masks cached). Mutable: use it
 *                 from one thread at a time (all states built on it included). Within a matcher, configurations
 *                 that behave alike share their vocabulary walks (constraint_sig.c: the counts of a maxLength
 *                 string or of x{1,300}, strings in different properties). The scheduler keeps its matchers in a
 *                 cache keyed by grammar (constraint_cache.h), so requests that give it the same grammar share one.
 *   dsv4_cstate   one stream's progress: its position (a configuration id and the bytes used) and its length
 *                 bound, on a matcher of its own (dsv4_cstate_new) or a shared one (dsv4_cstate_new_shared).
 *
 * Ownership: dsv4_cmatcher_new and dsv4_cstate_new borrow the grammar and the vocabulary, which must outlive
 * them; dsv4_cstate_new_shared borrows the matcher, which must outlive the state; dsv4_cstate_new's private
 * matcher is freed with the state. Everything returned by *_new is owned by the caller and released with the
 * matching *_free. The mask functions write into caller-owned memory.
 *
 * Per step:   dsv4_cstate_mask(st, logits)       disallowed tokens' logits become -INFINITY (do this before
 *                                               temperature / top-k / top-p, and before a greedy argmax)
 *             tok = sample(logits)
 *             dsv4_cstate_advance(st, tok)       the output now includes tok
 * The EOS token is allowed exactly when the output so far is a complete value (dsv4_cstate_complete); added
 * and special tokens are allowed only where the grammar names them (GE_TOKEN), and count as one byte of the
 * length bound (and of dsv4_cpos.used). After EOS the state is finished and allows nothing.
 *
 * Rollback (speculative decoding): a state's position is a small value (dsv4_cpos). Save it with
 * dsv4_cstate_get before trying tokens and put it back with dsv4_cstate_set: O(1), nothing to free. A saved
 * position stays valid for the life of the matcher (its interned tables only grow), also across states on it.
 *
 * Length bound: with max_bytes >= 0 the output (without EOS) never exceeds max_bytes bytes. A token is allowed
 * only if, after it, the shortest completion still fits: so the mask always leaves a path to a complete value,
 * and since every token is at least one byte, a stream whose token budget is max_new_tokens completes its value
 * and emits EOS within the budget when max_bytes = max_new_tokens - 1 (vocabularies with all 256 single-byte
 * tokens, as byte-level BPE has). This is also what makes a random model terminate. If even the shortest value
 * does not fit, only EOS is allowed (the output ends incomplete). max_bytes < 0: no bound. */
#ifndef DSV4_ENGINE_CONSTRAINT_H
#define DSV4_ENGINE_CONSTRAINT_H
#include "dsv4.h"
#include "engine/grammar_ir.h"
#include <stddef.h>
#include <stdint.h>

typedef struct dsv4_tokenizer dsv4_tokenizer;

/* ---- vocabulary ------------------------------------------------------------------------------------------ */

typedef struct dsv4_cvocab dsv4_cvocab;

/* n_vocab: the model's vocabulary size (the logits row length; may exceed the tokenizer's: the extra ids are
 * never allowed). eos_id: the model's end-of-sequence token. Added tokens are excluded. */
int  dsv4_cvocab_from_tokenizer(const dsv4_tokenizer *t, int32_t n_vocab, int32_t eos_id, dsv4_cvocab **out,
                                dsv4_error *err);
/* From raw byte strings: bytes[i] / lens[i] for id i (NULL or length 0 = never allowed). */
int  dsv4_cvocab_new(const char *const *bytes, const size_t *lens, int32_t n_vocab, int32_t eos_id, dsv4_cvocab **out,
                     dsv4_error *err);
void dsv4_cvocab_free(dsv4_cvocab *v);
/* Walk the vocabulary once for the string forms of JSON values (plain, and '<'-escaped as tool calls use), so
 * that every matcher on this vocabulary starts with those walks stored (constraint_sig.c): the first string of
 * the first request with a schema is no longer a walk of the whole trie. ~10 ms on a 129k vocabulary;
 * dsv4_cvocab_from_tokenizer does it. Call before the vocabulary is shared (it is read-only afterwards). */
int  dsv4_cvocab_prepare_json(dsv4_cvocab *v, dsv4_error *err);
int32_t dsv4_cvocab_size(const dsv4_cvocab *v);
int32_t dsv4_cvocab_eos(const dsv4_cvocab *v);
/* The bytes of token id (NULL for EOS, special tokens and ids without bytes: never allowed as text). */
const char *dsv4_cvocab_bytes(const dsv4_cvocab *v, int32_t id, size_t *len);
/* Special (added) tokens, by text: a grammar may name them (grammar_ir.h GE_TOKEN, GBNF @"text"); they are
 * allowed only there. dsv4_cvocab_from_tokenizer adds every added token but EOS; id must have no bytes. */
int  dsv4_cvocab_add_special(dsv4_cvocab *v, const char *text, size_t n, int32_t id, dsv4_error *err);
int32_t dsv4_cvocab_special_id(const dsv4_cvocab *v, const char *text);   /* -1 when unknown */

/* ---- per-stream state ------------------------------------------------------------------------------------ */

typedef struct dsv4_cstate dsv4_cstate;
typedef struct dsv4_cmatcher dsv4_cmatcher;

int  dsv4_cmatcher_new(const dsv4_grammar *g, const dsv4_cvocab *v, dsv4_cmatcher **out, dsv4_error *err);
void dsv4_cmatcher_free(dsv4_cmatcher *m);
const dsv4_cvocab *dsv4_cmatcher_vocab(const dsv4_cmatcher *m);
/* Memory the matcher holds now. Its tables only grow (that is what keeps saved positions valid): a long-running
 * server replaces a matcher past its budget once no state uses it. Growth is bounded (about 4M configurations,
 * then mask/advance report DSV4_E_NOMEM). */
size_t dsv4_cmatcher_bytes(const dsv4_cmatcher *m);

typedef struct {
    int32_t cfg;        /* interned configuration (set of parse stacks); -1 after EOS */
    int64_t used;       /* output bytes so far */
} dsv4_cpos;

/* A state on a private matcher (freed with it). */
int  dsv4_cstate_new(const dsv4_grammar *g, const dsv4_cvocab *v, int64_t max_bytes, dsv4_cstate **out, dsv4_error *err);
/* A state on a shared matcher (borrowed). */
int  dsv4_cstate_new_shared(dsv4_cmatcher *m, int64_t max_bytes, dsv4_cstate **out, dsv4_error *err);
void dsv4_cstate_free(dsv4_cstate *s);
dsv4_cmatcher *dsv4_cstate_matcher(dsv4_cstate *s);

/* The allowed-token set as a bitset of ceil(n_vocab / 64) words (bit i of word i/64 = token i allowed), into
 * caller-owned bits. Returns 0, or DSV4_E_NOMEM when the state's tables cannot grow (err set). */
int  dsv4_cstate_allowed(dsv4_cstate *s, uint64_t *bits, dsv4_error *err);
/* Set logits[i] = -INFINITY for every token not allowed now (logits has n_vocab entries). */
int  dsv4_cstate_mask(dsv4_cstate *s, float *logits, dsv4_error *err);
/* 1 when token id is allowed now (the same answer as the mask, without computing all of it). */
int  dsv4_cstate_allows(dsv4_cstate *s, int32_t id);
/* Consume token id. A token the constraint does not allow is refused (DSV4_E_ARG, the state is unchanged). */
int  dsv4_cstate_advance(dsv4_cstate *s, int32_t id, dsv4_error *err);
/* 1 when the output so far is a complete value (EOS is allowed). */
int  dsv4_cstate_complete(const dsv4_cstate *s);
/* 1 after EOS was consumed. */
int  dsv4_cstate_finished(const dsv4_cstate *s);
dsv4_cpos dsv4_cstate_get(const dsv4_cstate *s);
void dsv4_cstate_set(dsv4_cstate *s, dsv4_cpos p);

/* Statistics of the state's matcher (shared by every state on it), for benchmarks: configurations and stack
 * nodes interned, trie walks, masks served from the cache, transitions computed, trie nodes visited, stack references
 * handled by closures (the work of computing transitions), context-independent walks served (wholly or up to some
 * depth: shared_partial) by the stored walk of a configuration that behaves alike (constraint_sig.c), and those answered by the
 * closed form of a counted repetition (count_forms, constraint_count.c). */
typedef struct { int64_t configs, stack_nodes, mask_walks, mask_hits, transitions, trie_nodes_visited, closure_refs, shared_walks, shared_partial, count_forms; } dsv4_cstate_stats;
void dsv4_cstate_get_stats(const dsv4_cstate *s, dsv4_cstate_stats *st);
#endif
