/* KV row storage formats (issue 5): how one cached row — a window K=V row, a compressed row or an indexer
 * row — is laid out in memory, written from fp32 and read by the attention and indexer kernels.
 *
 *   f32   width fp32 values (the reference; what every other format is compared against).
 *   bf16  width BF16 values.
 *   fp8   main rows (window and compressed, width D with the last `rope` dims rotated):
 *           [D-rope] E4M3 codes | [ceil((D-rope)/64)] UE8M0 scale bytes | [rope] BF16 (little-endian)
 *         the value of non-rope dim i is e4m3(code[i]) * 2^(scale[i/64]-127): the exact form of the official
 *         FP8 simulation of the K=V non-rope dims (spec §7.2) and of the compressed rows (spec §8.3);
 *         indexer rows (width I, already Hadamard-rotated in OFFICIAL mode):
 *           [ceil(I/2)] E2M1 codes, two per byte (element 2i in the low nibble) | [ceil(I/32)] UE8M0 scales
 *         the exact form of the official FP4 simulation of the indexer keys (spec §8.3).
 *
 * Encoding computes each block's scale with the official rule (2^ceil(log2(amax/qmax)))) and rounds to the
 * nearest code. In OFFICIAL mode the values written are already the output of that very simulation, so every
 * value is representable and fp8 (and bf16) storage is lossless: the decoded row equals the fp32 row bit for
 * bit (re-deriving the scale from the simulated values gives the same scale or half of it, and both represent
 * every simulated value exactly). In EXACT mode the encode rounds: bf16 and fp8 KV are approximations of the
 * mathematical model there (the deviation is measured by tests/unit/test_kv.c), deterministic and identical
 * for every way of splitting the tokens into calls. EXACT-mode indexer rows are not Hadamard-rotated (only
 * OFFICIAL mode rotates keys and queries), so their FP4 storage is coarser there than in the official model.
 *
 * Reading never builds a dequantized copy of the cache: kv_dot and kv_axpy decode a row on the fly and give
 * exactly the bits of dot_f32 / the fp32 accumulation over the decoded row (same lanes, same order), which is
 * what keeps OFFICIAL-mode logits bit-identical across formats. */
#ifndef DSV4_STATE_KVROWS_H
#define DSV4_STATE_KVROWS_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>
#include <math.h>

/* Widest row the formats accept (stack scratch in the readers). */
#define KV_MAX_WIDTH 4096

typedef enum { KV_ROW_MAIN = 0, KV_ROW_INDEX = 1 } kv_row_kind;

typedef struct {
    int fmt;        /* dsv4_kv_format */
    int kind;       /* kv_row_kind */
    int width;      /* fp32 values per row */
    int rope;       /* trailing rope dims (main rows): kept in BF16 by fp8 */
    int nope;       /* width - rope (main rows), the FP8 part */
    size_t bytes;   /* stored bytes per row */
} kv_layout;

/* Bytes of one stored row (no model needed: persist.c sizes state files from their header with it). */
size_t kv_row_bytes(int fmt, kv_row_kind kind, int width, int rope);
void kv_layout_init(kv_layout *l, int fmt, kv_row_kind kind, int width, int rope);
const char *kv_format_name(int fmt);          /* "f32", "bf16", "fp8", or NULL when unknown */
int kv_format_parse(const char *name);        /* the format, or -1 */
/* Can this model shape store its KV in fmt? 0, or a DSV4_E_ARG failure saying why. */
int kv_format_check(int fmt, int head_dim, int rope_dim, int index_head_dim, dsv4_error *err);

/* Write one row from fp32 (x and dst must not overlap). */
void kv_encode(const kv_layout *l, const float *x, uint8_t *dst);
/* Decode one row to fp32 (exact). */
void kv_decode(const kv_layout *l, const uint8_t *src, float *out);
/* Decode values [i0, i0 + n) of one row to fp32 (exact: each value as kv_decode gives it). */
void kv_decode_range(const kv_layout *l, const uint8_t *row, int i0, int n, float *out);
/* dot(q, row): bit-identical to dot_f32(q, decoded row, width). */
float kv_dot(const kv_layout *l, const float *q, const uint8_t *row);
/* out[j] += a * row[j] for j < width, with the same expression as kv_axpy_f32 on the decoded row. */
void kv_axpy(const kv_layout *l, float a, const uint8_t *row, float *out);

/* The fp32 accumulation every format shares (the attention's P.V): one fmaf a key and column, as the CUDA
 * kernels accumulate it. */
static inline void kv_axpy_f32(float a, const float *v, float *out, int n) {
    for (int j = 0; j < n; j++) out[j] = fmaf(a, v[j], out[j]);
}

/* KV bytes that one context token adds to a sequence, by layer type (spec §15.1): a ratio-4 layer stores one
 * main row and one indexer row per 4 tokens, a ratio-128 layer one main row per 128 tokens; window layers
 * (and the window part of every layer) hold a fixed ring of `window` rows, reported as ring_bytes. */
typedef struct {
    double per_token;          /* bytes per context token, all layers */
    double per_token_csa;      /* of one ratio-4 layer */
    double per_token_hca;      /* of one ratio-128 layer */
    double ring_bytes;         /* all layers' window rings (window rows each, no speculative slack) */
    size_t main_row, index_row;/* bytes per stored row */
} kv_cost;
void kv_cost_of(int fmt, int n_layers, const int *ratio, int head_dim, int rope_dim, int index_head_dim, int window,
                kv_cost *out);
/* Print "KV bytes per context token" lines for every format to f (inspect, bench); `loaded` (a format, or
 * -1) is marked. Each line is prefixed with `indent`. */
void kv_cost_report(void *f, const char *indent, int loaded, int n_layers, const int *ratio, int head_dim, int rope_dim,
                    int index_head_dim, int window);
#endif
