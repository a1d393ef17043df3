/* Benchmark checkpoints too big to write (V4-Flash is ~150 GB, V4-Pro ~860 GB; the GPU machine has 64 GiB of
 * disk): `dsv4 bench --synthetic flash|pro --device cuda` writes the small tensors for real (norms, mHC, router,
 * hash tables: what makes routing and attention behave) and leaves every big matrix a hole in a sparse shard
 * (zeros on read, no disk blocks). config.json says so ("dsv4_synthetic": "holes"), and the CUDA loader fills each
 * hole with random values in its format directly in GPU memory (k_synth.cu) instead of copying zeros. Both sides
 * decide what is a hole with the rules below, so they cannot disagree. */
#ifndef DSV4_MODEL_SYNTHETIC_H
#define DSV4_MODEL_SYNTHETIC_H
#include "model/safetensors.h"
#include "model/weight.h"
#include <stddef.h>

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
#endif
