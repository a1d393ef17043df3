/* Synthetic checkpoints in the exact official format (`dsv4 tiny`, DESIGN §7; spec §2).
 *
 * A checkpoint is a pure function of (config, speculative-head kind, seed): every tensor draws its values from
 * its own random stream, seeded by the global seed and the tensor's name, so the bytes of a tensor do not depend
 * on the order or the sharding in which tensors are written. Values are stored in the official formats:
 * FP8 E4M3 with UE8M0 128x128 block scales, FP4 E2M1 experts (two per byte, element 2i in the low nibble) with one
 * UE8M0 scale per 32 inputs, BF16/F32 as the inventory says, I32 tid2eid rows of distinct experts. */
#ifndef DSV4_MODEL_TINY_H
#define DSV4_MODEL_TINY_H
#include "model/config.h"
#include "model/inventory.h"
#include <stdint.h>

/* ---- deterministic random numbers (xoshiro256**, seeded through splitmix64; no global state) ---------- */

typedef struct {
    uint64_t s[4];
    int      has_spare;   /* Box-Muller makes normals in pairs; the second is kept here */
    double   spare;
} dsv4_rng;

void     dsv4_rng_seed(dsv4_rng *r, uint64_t seed);
uint64_t dsv4_rng_u64(dsv4_rng *r);
double   dsv4_rng_uniform(dsv4_rng *r);               /* [0, 1), 53 random bits */
double   dsv4_rng_normal(dsv4_rng *r);                /* N(0, 1) */
uint32_t dsv4_rng_below(dsv4_rng *r, uint32_t n);     /* uniform in [0, n), n >= 1, unbiased */

/* ---- weight quantization into the official storage formats -------------------------------------------- */

/* FP8 block quantization of a row-major [O, I] fp32 matrix: for each 128x128 block (partial at the edges) the
 * scale is the smallest power of two s with amax/s <= 448, stored as UE8M0 in scale[ceil(O/128)][ceil(I/128)];
 * each value is E4M3(w/s), round-to-nearest-even. An all-zero block gets scale 1 (byte 127). */
void dsv4_quant_fp8_blocks(const float *w, int64_t O, int64_t I, uint8_t *q, uint8_t *scale);
/* FP4 quantization of a row-major [O, I] matrix (I % 32 == 0): one UE8M0 scale per 32 inputs of a row,
 * the smallest power of two s with amax/s <= 6; codes E2M1(w/s) packed two per byte, element 2i low nibble.
 * q is [O][I/2] bytes, scale is [O][I/32]. */
void dsv4_quant_fp4_groups(const float *w, int64_t O, int64_t I, uint8_t *q, uint8_t *scale);

/* ---- the checkpoint writer ----------------------------------------------------------------------------- */

typedef struct {
    const char  *preset;     /* "flash-tiny" (default when NULL) or "pro-tiny" */
    uint64_t     seed;
    const char *const *sets; /* "KEY=VALUE" config.json overrides; KEY may be dotted (rope_scaling.factor) */
    int          n_sets;
    dsv4_mtp_kind mtp;
    int          n_shards;   /* 0 = 2 */
} dsv4_tiny_opts;

/* Compose the config.json of opts (preset, then overrides, then the fields the speculative heads need) and
 * validate it with dsv4_config_parse. *json_text (caller frees) is what config.json will contain. */
int dsv4_tiny_config(const dsv4_tiny_opts *opts, char **json_text, dsv4_config *cfg, dsv4_error *err);

/* Write the weights of a validated config into dir (which must exist): shards + index, nothing else. */
int dsv4_tiny_write_weights(const char *dir, const dsv4_config *cfg, dsv4_mtp_kind mtp, uint64_t seed,
                            int n_shards, dsv4_error *err);

/* Create dir (mkdir -p) and write config.json + shards + index. */
int dsv4_tiny_write(const char *dir, const dsv4_tiny_opts *opts, dsv4_error *err);
#endif
