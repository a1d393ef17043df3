/* Shared by the constrained-decoding targets (fuzz_json_schema, fuzz_grammar): a fixed small vocabulary and a
 * walk of a compiled grammar through dsv4_cstate with the API's invariants checked at every step. */
#ifndef DSV4_TESTS_FUZZ_CONSTRAINT_WALK_H
#define DSV4_TESTS_FUZZ_CONSTRAINT_WALK_H
#include "engine/constraint.h"
#include <stddef.h>
#include <stdint.h>

/* The fixture vocabulary (built on first use, read-only after, freed at exit): ids 0..255 the single bytes,
 * then a few multi-byte tokens (JSON punctuation and keywords, UTF-8 sequences whole and cut, a token with a
 * NUL byte), two special tokens a grammar may name ("<S>" and the DSML marker; each stands as "S" in the output),
 * one id that is never allowed (no bytes), EOS last. */
const dsv4_cvocab *fuzz_cvocab(void);

/* Walk g for up to FUZZ_WALK_MAX_BYTES + 1 steps with max_bytes FUZZ_WALK_MAX_BYTES, choosing allowed tokens
 * from data (fuzz_rng). Checks: the bitset and dsv4_cstate_allows agree (EOS and 7 sampled ids per step); until
 * EOS something is allowed; EOS is allowed when the output is complete (or nothing else is); an allowed token
 * fits the length bound and is accepted; a refused token leaves the position unchanged; get/set of a position
 * restores the same mask; the state finishes within the budget. The output (EOS excluded, NUL-terminated,
 * malloc'd) goes to *out / *out_len and *complete says whether EOS was taken on a complete value; *out is NULL
 * when the matcher ran out of room. */
#define FUZZ_WALK_MAX_BYTES 64
void fuzz_constraint_walk(const dsv4_grammar *g, const uint8_t *data, size_t size, char **out, size_t *out_len,
                          int *complete);
#endif
