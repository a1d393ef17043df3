/* Drafters by name (`--spec ngram|self|mtp|dspark`), and the scheduler's drafter factory over them. */
#ifndef DSV4_ENGINE_DRAFTER_NAMED_H
#define DSV4_ENGINE_DRAFTER_NAMED_H
#include "engine/speculative.h"

/* 1 when name is a drafter this file makes. */
int dsv4_drafter_name_known(const char *name);
/* The drafter `name` for one stream of model m with that stream's sampling parameters: ngram (prompt lookup,
 * n-grams 1..4), self, mtp (the checkpoint's V4 MTP head), dspark (its DSpark drafter). A checkpoint without
 * the head gives the drafter's one-line error. */
int dsv4_drafter_named(const char *name, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err);
/* The same as a dsv4_sched_spec.make (ctx: the name, a string that outlives the scheduler's requests). */
int dsv4_drafter_named_make(void *ctx, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err);
/* Drafts per step a drafter proposes at most by default: mtp 1 (one head), dspark the checkpoint's block
 * size, the others 4; never more than the model's max_spec - 1. */
int dsv4_drafter_default_draft(const char *name, const dsv4_model *m);
#endif
