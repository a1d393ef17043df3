/* Shared by every fuzz target (tests/fuzz/fuzz_*.c).
 *
 * A target is one file defining LLVMFuzzerTestOneInput and, when it needs a fixture (a tiny model, a loaded
 * tokenizer), LLVMFuzzerInitialize. The same file is linked two ways (Makefile):
 *   - with libFuzzer (`make fuzz`, clang, -fsanitize=fuzzer,address,undefined): coverage-guided fuzzing;
 *   - with tests/fuzz/replay/main.c (every build, any compiler): replays the committed corpus and regression
 *     inputs, so `make test` / `make test-asan` run every input ever found interesting.
 * Fixtures are the one global state a target may keep: built once by LLVMFuzzerInitialize, read-only after,
 * freed at exit. Everything a target writes goes under fuzz_tmpdir(). */
#ifndef DSV4_TESTS_FUZZ_H
#define DSV4_TESTS_FUZZ_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A finding that is not a sanitizer report (a broken invariant): print it and abort, so libFuzzer saves the
 * input and the replay test fails. */
#define FUZZ_CHECK(cond, ...)                                                                    \
    do {                                                                                         \
        if (!(cond)) fuzz_die(__FILE__, __LINE__, #cond, __VA_ARGS__);                            \
    } while (0)
void fuzz_die(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

/* A failed call must keep the engine's error contract: a negative dsv4_status equal to err->code and a
 * non-empty one-line message (DESIGN §7: one line on stderr). */
void fuzz_check_error(int rc, const dsv4_error *err);

/* A private folder, made on first use (mkdtemp under $TMPDIR or /tmp) and removed with its contents at exit. */
const char *fuzz_tmpdir(void);
/* Remove a folder and everything in it (a fuzz_tmpdir subfolder). */
void fuzz_rmtree(const char *dir);
/* Write a whole file; aborts on failure (the fixture's disk, not the input, is broken). */
void fuzz_write_file(const char *path, const void *data, size_t n);
/* Read a whole file (heap, NUL-terminated); aborts on failure. */
char *fuzz_read_file(const char *path, size_t *n);
/* A NUL-terminated heap copy of n bytes. */
char *fuzz_strndup(const uint8_t *data, size_t n);

/* A small deterministic generator (splitmix64) for choices derived from the input: same input, same run. */
typedef struct { uint64_t s; } fuzz_rng;
void     fuzz_rng_seed(fuzz_rng *r, const uint8_t *data, size_t n);
uint64_t fuzz_rng_next(fuzz_rng *r);

/* The shared tiny checkpoint (lib/tiny_fixture.c): all three layer kinds (window, ratio 4, ratio 128),
 * a hash-routed layer, FP4 experts, window 4 so short sequences already wrap the ring. */
int         fuzz_tiny_write(const char *dir, int n_shards, dsv4_error *err);
/* The same with a speculative head: mtp is a dsv4_mtp_kind (0 none, 1 V4 MTP, 2 DSpark). */
int         fuzz_tiny_write_mtp(const char *dir, int n_shards, int mtp, dsv4_error *err);
/* Load quietly, one thread, EXACT mode, KV rows stored as kv_format (a dsv4_kv_format); aborts on failure. */
dsv4_model *fuzz_tiny_model(const char *dir, int kv_format);
/* A state of the fixture model after tokens 0..n-1 of a fixed sequence (saved with dsv4_seq_save_mem). */
void        fuzz_tiny_state(dsv4_model *m, int n, void **buf, size_t *len);

/* Run one greedy stream speculating with drafter `kind` (mtp, dspark) over prompt[0..n) with a prefix cache on
 * dir (lib/spec_cache_fixture.c): dir then holds the state of prompt[0..n-1) and that drafter's state beside it
 * (p-...-<n-1>-<hash>.<kind>.dsv4comp). Aborts on failure. */
void        fuzz_spec_cache_fill(dsv4_model *m, const char *kind, const int32_t *prompt, int n, const char *dir);

/* The tiny tokenizer the text targets share (lib/tokenizer_fixture.c); aborts when it cannot be loaded. */
struct dsv4_tokenizer;
struct dsv4_tokenizer *fuzz_tiny_tokenizer(void);
#endif
