/* Sequence state files (DESIGN §2: state is plain data, so save/restore = write/read the fields).
 *
 * Format version 2, little-endian, no padding between fields:
 *
 *   header   magic "DSV4SEQ\x1a" (8) | u32 version | u32 numeric mode | u64 model fingerprint
 *            | u32 kv storage word | u32 n_layers | u32 head_dim
 *            | u32 index_head_dim | u32 window | u32 ring_len (of the saving model; informational)
 *            | i64 position | u8 ratio[n_layers] (0, 4 or 128)
 *            | char writer[48]   (version 2) the build that wrote the file, "dsv4 0.1.0 (commit 0123456789ab)":
 *                                printable ASCII, NUL-padded; informational (dsv4 state inspect shows it), never
 *                                a reason to refuse a file: compatibility is decided by the format version and
 *                                the model fingerprint
 *            kv storage word: bits 0-7 the format (0 f32, 1 bf16, 2 fp8 = dsv4_kv_format), bits 8-31 the
 *            rope dims that fp8 keeps in BF16 (0 for f32 and bf16): together they fix the byte size of a row
 *            (state/kvrows.h), so the header still determines the file length without the model
 *   tokens   i32[position]                         token history
 *   layer L  (in order)
 *            row[min(pos, window)]                 the live window rows (kv format, head_dim), oldest first (positions
 *                                                  pos-nwin .. pos-1); the ring's dead slots are not saved,
 *                                                  so the file does not depend on the ring layout (max_spec)
 *            ratio != 0: f32 kv[n][cols], f32 score[n][cols]   main compressor: the projections of its live
 *                        positions live_first(pos) .. pos-1 (compressor.h; n < 2m, cols = coff*head_dim)
 *                        i64 n_rows (= pos / ratio), row[n_rows]  compressed rows (kv format, head_dim)
 *            ratio == 4: the same for the indexer's compressor (cols = 2*index_head_dim)
 *                        i64 n_rows (= pos / 4), irow[n_rows]  indexer rows (kv format, index_head_dim)
 *   trailer  u64 XXH64 (seed 0) of every byte before it
 *
 * Version 1 is version 2 without the writer field; it is still read (and reported as "unknown, format v1").
 *
 * The header alone determines the exact file length, so truncation and trailing bytes are caught before the
 * checksum is even computed. */
#ifndef DSV4_STATE_PERSIST_H
#define DSV4_STATE_PERSIST_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

#define PERSIST_MAGIC "DSV4SEQ\x1a"
#define PERSIST_VERSION 2u        /* what this build writes */
#define PERSIST_MIN_VERSION 1u    /* the oldest it reads */
#define PERSIST_FIXED_BYTES 56    /* header bytes before the ratio table */
#define PERSIST_WRITER_BYTES 48   /* version >= 2: the writer field after the ratio table */

typedef struct {
    uint32_t version, mode, kv_format;
    uint64_t fingerprint;
    uint32_t n_layers, head_dim, index_head_dim, window, ring_len;
    int64_t pos;
    uint8_t ratio[256];
    char writer[PERSIST_WRITER_BYTES + 1];   /* NUL-terminated; "" in a version 1 file */
} persist_header;

/* The header's kv storage word <-> (dsv4_kv_format, rope dims). unpack: 0, or -1 when the word is unknown. */
uint32_t persist_kv_pack(int fmt, int rope);
int persist_kv_unpack(uint32_t word, int *fmt, int *rope);

/* Byte sizes implied by a header (no model needed). */
typedef struct {
    uint64_t header, tokens, total;        /* total includes the 8-byte checksum */
    uint64_t layer[256];                   /* bytes of each layer's section */
    uint64_t fixed;                        /* bytes that do not grow with position once pos >= window */
    double   per_token;                    /* bytes added per context token in the long run */
} persist_sizes;

/* Fill *sz for header h. Returns 0, or -1 when a field is out of the ranges this format accepts. */
int persist_sizes_of(const persist_header *h, persist_sizes *sz);

/* Parse and check a state buffer without a model: magic, version, ranges, exact length, checksum. */
int persist_read_header(const void *buf, size_t len, persist_header *h, dsv4_error *err);
#endif
