/* Benchmark of constrained decoding (dsv4 bench --grammar): vocabulary trie build, schema compile time, and the
 * time to mask one logits row (dsv4_cstate_mask) per generated token, median and p99, for a set of schemas on
 * the given tokenizer's vocabulary (the real DeepSeek one: 129,280 tokens). Two token sources per schema:
 *   replay  a valid document, encoded with the tokenizer, fed token by token (what a model that writes good
 *           JSON does: the mask cache works as in real use);
 *   random  a uniform draw among the allowed tokens at every step (a worst case: long, odd strings, many fresh
 *           configurations), ended by the length bound.
 * Speed is measured, never asserted. */
#ifndef DSV4_ENGINE_CONSTRAINT_BENCH_H
#define DSV4_ENGINE_CONSTRAINT_BENCH_H
#include "dsv4.h"
#include <stdio.h>

typedef struct dsv4_tokenizer dsv4_tokenizer;

int dsv4_constraint_bench(const dsv4_tokenizer *t, FILE *out, dsv4_error *err);

/* Overhead on a batched decode step (when the folder is also a model, on the model's device: --device): for
 * B = 1, 8, 32 streams, the time of one decode step of B streams (dsv4_bench_streams, wall clock) against the CPU time of the B masks such a step
 * needs (B JSON-mode streams on one shared matcher replaying a document, as a server's requests with one
 * schema), first request (cold matcher) and later ones (warm), and their ratio. */
int dsv4_constraint_bench_overhead(dsv4_model *m, const dsv4_tokenizer *t, FILE *out, dsv4_error *err);
#endif
