/* Test helpers: write a synthetic checkpoint to a temporary folder and run sequences through the engine. */
#ifndef DSV4_TEST_TESTMODEL_H
#define DSV4_TEST_TESTMODEL_H
#include "dsv4.h"
#include <stdint.h>

/* Write a tiny checkpoint (preset + "KEY=VALUE" overrides, seed) into a new temp folder and load it.
 * Returns NULL (after printing why) on failure. The folder name is written to dir_out (>= 256 bytes). */
dsv4_model *tm_make(const char *preset, const char *const *sets, int n_sets, uint64_t seed, dsv4_mode mode,
                    char *dir_out);
/* The same on a device (a dsv4_device) with a KV storage format (a dsv4_kv_format). */
dsv4_model *tm_make_on(const char *preset, const char *const *sets, int n_sets, uint64_t seed, dsv4_mode mode, int device,
                       int kv, char *dir_out);
/* Load a checkpoint folder; NULL (after printing why) on failure. */
dsv4_model *tm_load(const char *dir, dsv4_mode mode, int device, int kv);
/* Remove a folder made by tm_make. */
void tm_rmdir(const char *dir);

/* Feed tokens[0..n) to a fresh sequence as calls of the given sizes (chunks == NULL: one call; the sizes
 * are used in turn and the rest goes one token per call). Returns a malloc'd [n][vocab] logits array. */
float *tm_logits(dsv4_model *m, const int32_t *tokens, int n, const int *chunks, int n_chunks);

/* Plain greedy decoding, one token per step after a one-call prefill: n_new ids into out. 0 on success. */
int tm_greedy(dsv4_model *m, const int32_t *prompt, int n_prompt, int n_new, int32_t *out);

/* Deterministic token sequence in [0, vocab). */
void tm_tokens(int32_t *out, int n, int vocab, uint64_t seed);
/* Read a whole file (NUL-terminated); NULL on failure. */
char *tm_read(const char *path);
#endif
