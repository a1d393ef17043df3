/* Benchmark checkpoints too big to write (V4-Flash is ~150 GB, V4-Pro ~860 GB; the GPU machine has 64 GiB of
 * disk): `dsv4 bench --synthetic flash|pro` writes the small tensors for real (norms, mHC, router, hash tables: what
 * makes routing and attention behave) and leaves every big matrix a hole in a sparse shard (zeros on read, no disk
 * blocks). config.json says so ("dsv4_synthetic": "holes"). The loader fills each hole with random values in its
 * format (model/synth_values.h) where the model will read it: the CUDA loader directly in GPU memory (k_synth.cu),
 * a CPU model in host memory (synth_host_build below). Writer and loaders decide what is a hole with the rules
 * below, so they cannot disagree. */
#ifndef DSV4_MODEL_SYNTHETIC_H
#define DSV4_MODEL_SYNTHETIC_H
#include "model/safetensors.h"
#include "model/weight.h"
#include <stddef.h>
#include <stdint.h>

#define SYNTH_HOLE_BF16_BYTES ((size_t)16 << 20)   /* BF16 matrices this big are holes: the embedding and the head */

/* A tensor of the checkpoint (its stored dtype and bytes) that the writer leaves as a hole. FP8 and FP4 weights
 * and their UE8M0 scales, and the big BF16 matrices. */
static inline int synthetic_hole_tensor(st_dtype d, size_t nbytes) {
    return d == ST_F8_E4M3 || d == ST_I8 || d == ST_F8_E8M0 || (d == ST_BF16 && nbytes >= SYNTH_HOLE_BF16_BYTES);
}

/* The same decision for a bound weight (the loader's view: its format and its data bytes). */
static inline int synthetic_hole_weight(int fmt, size_t nbytes) {
    return fmt == WF_FP8 || fmt == WF_FP4 || (fmt == WF_BF16 && nbytes >= SYNTH_HOLE_BF16_BYTES);
}

/* ---- the host's fill (synthetic.c) ---- */

/* What fills a hole tensor of dtype d: SYNTH_FP8, SYNTH_FP4 (I8-packed), SYNTH_BF16, or 0 for UE8M0 scales (every
 * byte SYNTH_SCALE_BYTE). */
int synthetic_hole_kind(st_dtype d);
/* Bytes [b0, b1) of a hole of this kind (0: scales) and seed whose byte 0 is at hole; b0 a multiple of 8. The
 * bytes do not depend on how a hole is cut into calls. */
void synth_fill(uint8_t *hole, size_t b0, size_t b1, int kind, uint64_t seed);

/* Host memory synthetic weights may take: DSV4_SYNTHETIC_HOST_GB (GiB, > 0) if set, else 60 % of the machine's
 * memory (the OS, the page-locked step buffers and the loader's copies keep room). A bad value is DSV4_E_ARG. */
int synth_host_budget(size_t *bytes, dsv4_error *err);

/* A synthetic checkpoint read by the CPU: every tensor in one arena on huge pages (util/bigmem.h), the real ones
 * copied, the holes filled (seed: 0x5eed0000 + the tensor's index). Everything but the routed experts' tensors (names
 * with ".ffn.experts.") has bytes of its own; the experts' tensors have their own while the arena stays within the
 * budget (and at least one of each dtype and shape), and the rest share those of the same dtype and shape in a cycle
 * (the k-th to share takes the (k mod n)-th of the n with bytes of their own): the cycle is gigabytes for a real
 * shape, far beyond any cache, so every expert a token uses is still read from memory. */
typedef struct {
    uint8_t *base;            /* the arena (NULL: none), owned */
    size_t bytes;
    int64_t expert_tensors;   /* the routed experts' tensors */
    int64_t expert_own;       /* those with bytes of their own */
} synth_host;

/* Builds h for archive a (its tensors' data repointed into the arena) with up to `threads` threads (<= 0: one per
 * CPU). Errors: the tensors other than the routed experts exceed the budget (DSV4_E_NOMEM, naming both), out of
 * memory; a failure leaves a's tensors as they were. */
int  synth_host_build(st_archive *a, size_t budget, int threads, synth_host *h, dsv4_error *err);
void synth_host_free(synth_host *h);
#endif
