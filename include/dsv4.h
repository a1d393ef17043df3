/* dsv4 — a native C inference engine for the DeepSeek V4 model family.
 *
 * Public API. Everything the CLI does goes through these calls.
 *
 * Ownership: every object returned by a *_new / *_load call is owned by the caller and released by the
 * matching *_free. Errors: every call that can fail returns a dsv4_status (0 = success) and, when `err` is
 * non-NULL, writes a one-line human-readable message into it. Nothing in the engine aborts on user input.
 */
#ifndef DSV4_H
#define DSV4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version and symbol export ------------------------------------------------------------------------ */

/* The library's version (semantic versioning: MAJOR changes break the API or ABI, the shared library's soname is
 * libdsv4.so.MAJOR). The Makefile reads these three lines; keep them in this form. */
#define DSV4_VERSION_MAJOR 0
#define DSV4_VERSION_MINOR 1
#define DSV4_VERSION_PATCH 0
#define DSV4_VERSION "0.1.0"

/* Every public function carries DSV4_API. The library is built with -fvisibility=hidden, so this is what exports
 * a symbol from libdsv4.so; everything else in the library stays private (checked by tests/cli/install.sh). */
#if defined(__GNUC__) || defined(__clang__)
#define DSV4_API __attribute__((visibility("default")))
#else
#define DSV4_API
#endif

/* The version of the library actually linked, e.g. "0.1.0" (compare with DSV4_VERSION, the header's). */
DSV4_API const char *dsv4_version(void);

/* ---- errors ------------------------------------------------------------------------------------------ */

typedef enum {
    DSV4_OK           = 0,
    DSV4_E_ARG        = -1, /* bad argument from the caller (token id out of range, bad option, ...) */
    DSV4_E_IO         = -2, /* file could not be opened / read / written */
    DSV4_E_FORMAT     = -3, /* malformed file: JSON, safetensors header, state file, ... */
    DSV4_E_MODEL      = -4, /* checkpoint does not match its config: missing tensor, wrong shape/dtype */
    DSV4_E_NOMEM      = -5, /* allocation failed */
    DSV4_E_RANGE      = -6, /* position / context overflow */
    DSV4_E_UNSUPPORTED= -7, /* a capability this build does not have */
    DSV4_E_STATE      = -8, /* sequence state mismatch (wrong model, corrupted, ...) */
} dsv4_status;

typedef struct {
    int  code;          /* a dsv4_status */
    char msg[512];      /* one line, no trailing newline */
} dsv4_error;

/* ---- numeric modes ----------------------------------------------------------------------------------- */

typedef enum {
    DSV4_MODE_EXACT    = 0, /* fp32 everywhere, no quantization simulation: the mathematical model */
    DSV4_MODE_OFFICIAL = 1, /* the official rounding/simulation points (BF16, FP8 act quant, KV FP8, indexer FP4) */
} dsv4_mode;

/* ---- model ------------------------------------------------------------------------------------------- */

typedef struct dsv4_model dsv4_model;

/* How the KV cache stores its rows (issue 5; src/state/kvrows.h has the layouts). Lossless in OFFICIAL mode
 * (the rows are already BF16/FP8/FP4-simulated there); an approximation in EXACT mode. */
typedef enum {
    DSV4_KV_F32  = 0,   /* fp32 rows */
    DSV4_KV_BF16 = 1,   /* bf16 rows */
    DSV4_KV_FP8  = 2,   /* E4M3 + UE8M0 scale per 64 non-rope dims, rope dims BF16; indexer rows FP4 per 32 */
} dsv4_kv_format;

/* Where the model's weights live and its steps run (DESIGN §8: one model, two backends). */
typedef enum {
    DSV4_DEVICE_CPU  = 0, /* host memory, the CPU kernels */
    DSV4_DEVICE_CUDA = 1, /* one NVIDIA GPU (sm_90a): weights, sequence state and every step on the device */
} dsv4_device;

typedef struct {
    dsv4_mode mode;      /* numeric mode used by every forward call on this model */
    int n_threads;       /* 0 = one per online CPU */
    int max_spec;        /* extra window-ring slots kept for speculative rollback (0 = default 16) */
    int quiet;           /* 1 = no progress output on stderr */
    int kv_format;       /* a dsv4_kv_format for every sequence of this model (0 = f32) */
    int device;          /* a dsv4_device (0 = cpu). cuda: the build must have the CUDA backend (make CUDA=1) and
                            the machine a GPU; otherwise loading fails with DSV4_E_UNSUPPORTED and one line why */
    int gpu;             /* CUDA device ordinal (0 = the first GPU) */
    int n_gpus;          /* cuda: 0 or 1 = one GPU; N > 1 = GPUs gpu .. gpu+N-1 with the routed experts spread over
                            them (expert parallelism over NCCL: the same bits as on one GPU) */
    int cpu_amx;         /* 1 = OFFICIAL mode's linears with bf16 inputs on Intel AMX tiles (core/numerics.h, src/backend/cpu/
                            amx.h: its own accumulation order, the same for every batch): 2x faster prefill, slower
                            decode on the machines measured. Loading fails with DSV4_E_UNSUPPORTED when the CPU or
                            kernel has no AMX-BF16; ignored in EXACT mode and on cuda */
    double gpu_mem_gb;   /* cuda: GiB of GPU memory for the weights (0 = what is free less a working margin). When
                            the weights need more, routed experts of the main layers stay in host memory and the
                            host's cores compute them (the KV cache and the step's scratch come on top) */
    const char *expert_profile; /* cuda: a routing profile (`dsv4 profile`) choosing which experts stay on the GPU
                            when not all fit: the most used. NULL = DIR/expert_profile.json when it exists, else
                            an even spread over the layers; "" = an even spread whatever exists */
    const char *cpu_isa; /* the CPU kernels' instruction set: "avx512", "avx2" or "scalar"; NULL, "" or "auto" =
                            $DSV4_ISA when set, else the best this CPU has. Every set gives the same bits (only
                            speed differs); DSV4_E_UNSUPPORTED when this CPU cannot run the one named */
    double bus_share;    /* cuda, routed experts in host memory: the share (0..1) of them that the GPU computes itself,
                            its expert kernels reading their weights from page-locked host memory over the bus (PCIe)
                            while the host's cores compute the rest. A fixed set per layer, so results stay
                            batch-invariant; those experts' rows are the all-GPU run's bits. 0 = the default: 0.15
                            where a token's expected host experts in a layer are 2 or more (n_act x the host's
                            fraction of the experts), 0.25 from 4, 1 below 0.25 (when they fit page-locked), else
                            none; a negative value = none (the host computes all) */
    int bus_by_token;    /* cuda, routed experts in host memory: 1 = split each token's routes to them instead of the
                            experts themselves: of a token's h routes to one layer's host experts, round(h x bus_share)
                            (bus_share 0 = the default, 0.25) are computed by the GPU over the bus, the rest by the
                            host's cores (docs/HOST_EXPERTS.md). A rule on the token's own routing, so results stay
                            batch-invariant. Every expert in host memory is page-locked: at most 60 % of the machine's
                            memory (else DSV4_E_NOMEM); 0 = off */
} dsv4_load_opts;

/* "cpu" / "cuda" -> a dsv4_device, or -1. */
DSV4_API int dsv4_device_parse(const char *name);
/* 1 when this build has the CUDA backend and a usable GPU; otherwise 0 and, when why is non-NULL, the reason
 * in why (one line). */
DSV4_API int dsv4_cuda_available(dsv4_error *why);

/* Load a checkpoint folder as published on Hugging Face (config.json or inference/config.json,
 * model.safetensors.index.json + shards or a single model.safetensors). Every tensor's presence, dtype and
 * shape is validated against the config before anything runs. */
DSV4_API int  dsv4_model_load(const char *dir, const dsv4_load_opts *opts, dsv4_model **out, dsv4_error *err);
DSV4_API void dsv4_model_free(dsv4_model *m);

typedef struct {
    int vocab_size, dim, n_layers, n_heads, head_dim, window;
    int64_t max_position;
    int bos_id, eos_id;
} dsv4_model_info;
DSV4_API void dsv4_model_get_info(const dsv4_model *m, dsv4_model_info *info);

/* ---- sequences and the one forward primitive ---------------------------------------------------------- */

typedef struct dsv4_seq dsv4_seq;

/* A new empty sequence. Its state lives on the model's device (GPU memory for a cuda model): save/restore,
 * fork, rollback and the prefix cache work the same on both, and the state format does not depend on the
 * device (a state saved from a cuda model restores on a cpu model of the same checkpoint and the other way). */
DSV4_API int     dsv4_seq_new(dsv4_model *m, dsv4_seq **out, dsv4_error *err);
DSV4_API void    dsv4_seq_free(dsv4_seq *s);
DSV4_API int64_t dsv4_seq_position(const dsv4_seq *s);     /* number of tokens processed so far */

/* Which logits a step item wants back. */
typedef enum {
    DSV4_LOGITS_NONE = 0,
    DSV4_LOGITS_LAST = 1,   /* [1][vocab]: the last new token's */
    DSV4_LOGITS_ALL  = 2,   /* [n_tokens][vocab]: every new token's */
} dsv4_logits_want;

/* How a token is drawn from a row of logits (src/core/sample.h defines every step, bit for bit). Greedy
 * (temperature <= 0) takes the largest logit, the lowest id on ties. Otherwise w_i = exp((l_i - max l) / T),
 * the filters keep a set of tokens (min-p: w_i >= min_p; top-k: the k first in the order (w desc, id asc);
 * top-p: the shortest prefix of that order holding top_p of what is left), and the token drawn is
 * argmax w_i / E_i over the kept ones, with E_i ~ Exp(1) a hash of (seed, draw number, i): the exponential race
 * of the official generate.py. The same logits, parameters and draw number give the same token on every
 * device. */
typedef struct {
    float temperature;   /* <= 0: greedy */
    int   top_k;         /* 0: off */
    float top_p;         /* >= 1: off */
    float min_p;         /* <= 0: off; keep tokens with p >= min_p * p_max */
    uint64_t seed;       /* the stream of draws */
    int32_t n_allowed;   /* > 0: only ids 0 .. n_allowed-1 can be drawn (the others count as -inf logits) */
} dsv4_sampling;

/* One sequence's share of a step: advance `seq` by `n_tokens` tokens from its own position. */
typedef struct {
    dsv4_seq       *seq;
    const int32_t  *tokens;
    int             n_tokens;
    dsv4_logits_want want;
    float          *logits;  /* caller-owned, sized per `want` */
    float          *hidden;  /* NULL, or caller-owned [n_tokens][hc_mult * dim]: each new token's final HC state
                                (before hc_head) — what the V4 MTP head drafts from */
    float          *features;/* NULL, or caller-owned [n_tokens][n_targets * dim]: the mean over the HC streams of
                                the output of each DSpark target layer (dspark_target_layer_ids) — what the DSpark
                                drafter's context keys are made from */
    const dsv4_sampling *sample; /* NULL, or draw a token from the last new token's logits, on the model's device
                                (only the id comes back: no logits row needs to reach the host). Independent of
                                `want` (both may be asked for). The parameters are checked like the sampler's. */
    uint64_t        draw;    /* with sample: the draw number in sample->seed's stream (a sampler's counter) */
    int32_t        *token;   /* with sample: where the drawn id goes */
} dsv4_step_item;

/* The one forward primitive: a ragged batch of (sequence, n new tokens). Prefill, chunked prefill,
 * single-token decode, speculative verification and multi-stream batching are all this call. The result is
 * bit-identical (EXACT mode) to feeding every token of every sequence one at a time. On error no sequence
 * is modified. A sequence may appear at most once per step. */
DSV4_API int dsv4_step(dsv4_model *m, dsv4_step_item *items, int n_items, dsv4_error *err);


/* ---- sequence state you can keep: save/restore, fork, snapshot/rollback ------------------------------ */

/* Save a sequence's whole state (spec §15.1) in the versioned binary format of src/state/persist.h:
 * header (magic, version, model fingerprint, numeric mode, KV storage format, shapes, position, token
 * history), every layer's live window rows, compressor states, compressed and indexer rows, then an XXH64
 * checksum over everything. *buf is malloc'd and owned by the caller (free()). Files are written atomically
 * (temporary file + rename). */
DSV4_API int dsv4_seq_save_mem(const dsv4_seq *s, void **buf, size_t *len, dsv4_error *err);
DSV4_API int dsv4_seq_save(const dsv4_seq *s, const char *path, dsv4_error *err);

/* Load a saved state into a new sequence of model m. Everything is validated first (magic, version,
 * length, checksum, fingerprint, mode, shapes, token ids, row counts); on any error nothing is allocated
 * and *out is untouched. Errors: DSV4_E_FORMAT (not a state file, truncated, corrupted, unknown version),
 * DSV4_E_STATE (another model, another numeric mode or shape), DSV4_E_IO, DSV4_E_NOMEM. */
DSV4_API int dsv4_seq_load_mem(dsv4_model *m, const void *buf, size_t len, dsv4_seq **out, dsv4_error *err);
DSV4_API int dsv4_seq_load(dsv4_model *m, const char *path, dsv4_seq **out, dsv4_error *err);

/* Replace the state of an existing sequence with a saved one; on error `s` is unchanged. */
DSV4_API int dsv4_seq_restore_mem(dsv4_seq *s, const void *buf, size_t len, dsv4_error *err);
DSV4_API int dsv4_seq_restore(dsv4_seq *s, const char *path, dsv4_error *err);

/* The token history: dsv4_seq_position(s) ids, owned by s, valid until its next step / restore / free. */
DSV4_API const int32_t *dsv4_seq_tokens(const dsv4_seq *s);

/* Size in bytes of the state dsv4_seq_save_mem would write now. */
DSV4_API size_t dsv4_seq_state_bytes(const dsv4_seq *s);

/* An independent copy of a sequence (same model); both continue on their own. */
DSV4_API int dsv4_seq_fork(const dsv4_seq *s, dsv4_seq **out, dsv4_error *err);

/* Atomic speculative rollback (spec §15.4). Take a snapshot before a step of k speculative tokens, then
 * commit the first `keep` of them (0 <= keep <= k) with dsv4_seq_rollback: the sequence becomes exactly
 * (bit for bit, serialised state included) what processing only those `keep` tokens would have made it.
 * k may not exceed the model's max_spec (the ring slack) unless every token is kept. A snapshot stays
 * valid for further rollbacks of the same sequence while its position is >= the snapshot's. */
typedef struct dsv4_seq_snapshot dsv4_seq_snapshot;
DSV4_API int  dsv4_seq_snapshot_new(const dsv4_seq *s, dsv4_seq_snapshot **out, dsv4_error *err);
DSV4_API void dsv4_seq_snapshot_free(dsv4_seq_snapshot *snap);
DSV4_API int  dsv4_seq_rollback(dsv4_seq *s, const dsv4_seq_snapshot *snap, int keep, dsv4_error *err);


/* Prefix cache (in memory, LRU, byte budget): keeps forks of sequences keyed by their token history; a lookup
 * forks the longest stored state whose tokens are a prefix of the request, so only the rest is processed.
 * Prefixes may end anywhere (mid compressor chunk, mid window wrap): a state is exact at every position. */
typedef struct dsv4_prefix_cache dsv4_prefix_cache;
typedef struct {
    int64_t hits, misses, entries, evictions;
    size_t bytes, budget;
    /* the optional on-disk tier; writes, rejections and evictions count files: state files and the drafter-state
     * files the scheduler's speculating streams keep beside them */
    int64_t disk_hits, disk_writes, disk_rejected, disk_evictions;
    size_t disk_bytes, disk_budget;
} dsv4_prefix_cache_stats;
DSV4_API int  dsv4_prefix_cache_new(size_t budget_bytes, dsv4_prefix_cache **out, dsv4_error *err);
DSV4_API void dsv4_prefix_cache_free(dsv4_prefix_cache *c);
/* Store a copy of s's state (no-op when the same history of the same model is stored already, or when
 * the state alone exceeds the budget); least recently used entries are evicted to stay within budget. */
DSV4_API int  dsv4_prefix_cache_put(dsv4_prefix_cache *c, const dsv4_seq *s, dsv4_error *err);
/* A new sequence for tokens[0..n): a fork of the longest stored prefix (*matched = its length, a hit) or a
 * fresh sequence (*matched = 0, a miss). The caller processes tokens[*matched..n). */
DSV4_API int  dsv4_prefix_cache_lookup(dsv4_prefix_cache *c, dsv4_model *m, const int32_t *tokens, int64_t n, dsv4_seq **out,
                              int64_t *matched, dsv4_error *err);
DSV4_API void dsv4_prefix_cache_get_stats(const dsv4_prefix_cache *c, dsv4_prefix_cache_stats *st);
/* Add an on-disk tier in folder `dir` (created if missing) with its own byte budget: every put also writes the
 * state there (atomically: temp file + rename) and evicts the least recently used files beyond the budget; a
 * lookup that memory cannot serve as well tries the files of the same model, longest prefix first. A file
 * that fails to load (corrupted, truncated, another model) is removed and counted as rejected, and the
 * lookup goes on: the caller recomputes. Several processes may share one folder. */
DSV4_API int  dsv4_prefix_cache_set_dir(dsv4_prefix_cache *c, const char *dir, size_t budget_bytes, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
