/* A routing profile: how often each routed expert of each main layer was chosen over a set of prompts
 * (`dsv4 profile`, issue 15). The loader uses it to decide which experts stay on the GPU when not all of them
 * fit: the most used ones (model/expert_place.h).
 *
 * The file is small JSON, written next to the checkpoint by default (expert_profile.json):
 *   {"dsv4_expert_profile": 1, "n_layers": L, "n_routed": E, "tokens": N, "counts": [[E integers] x L]}
 * counts[l][e] = how many of the N profiled tokens layer l sent to expert e (a token naming an expert twice in
 * its routing row counts once, as the MoE computes it once). Reading checks everything: the format tag, that
 * the shape is the model's, that every count is a non-negative integer and no layer counts more than N * top-k
 * choices. */
#ifndef DSV4_MODEL_EXPERT_PROFILE_H
#define DSV4_MODEL_EXPERT_PROFILE_H
#include "dsv4.h"
#include <stdint.h>

#define EXPERT_PROFILE_FILE "expert_profile.json"   /* its name in a checkpoint folder */

typedef struct {
    int n_layers, n_routed;
    uint64_t tokens;      /* tokens profiled */
    uint64_t *counts;     /* [n_layers][n_routed], owned */
} expert_profile;

/* An all-zero profile of this shape (counts allocated). */
int  expert_profile_init(expert_profile *p, int n_layers, int n_routed, dsv4_error *err);
void expert_profile_free(expert_profile *p);

/* Write p as JSON to path (through a temporary file renamed into place: a reader never sees half a file). */
int  expert_profile_save(const expert_profile *p, const char *path, dsv4_error *err);
/* Read and validate a profile for a model of n_layers main layers and n_routed experts, top_k experts per
 * token. Any damage is an error naming the file and what is wrong; *p is untouched then. */
int  expert_profile_load(const char *path, int n_layers, int n_routed, int top_k, expert_profile *p, dsv4_error *err);
/* The same from bytes in memory (what load reads; the fuzz and unit tests call it directly). */
int  expert_profile_parse(const char *text, size_t len, const char *name, int n_layers, int n_routed, int top_k,
                          expert_profile *p, dsv4_error *err);
/* The profile a load uses: path, else DIR/expert_profile.json when it exists (damage is an error either way: a
 * profile is never silently ignored), else none; path "" = none. None leaves *p zeroed (counts NULL). */
int  expert_profile_find(const char *dir, const char *path, int n_layers, int n_routed, int top_k, expert_profile *p,
                         dsv4_error *err);
#endif
