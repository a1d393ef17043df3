/* All fuzz targets in one libFuzzer program (`fuzz_all`), for a machine that the binaries must be carried to:
 * fifteen sanitizer builds of the same library would be fifteen times its size (tools/gpu/fuzz_stage.sh).
 *
 * The Makefile compiles each tests/fuzz/fuzz_<name>.c once more with its two entry points renamed
 * (LLVMFuzzerTestOneInput -> fuzz_target_<name>_run, LLVMFuzzerInitialize -> fuzz_target_<name>_init) and generates
 * targets.h, one FUZZ_TARGET(name) line per target, so adding a target needs no edit here. This file defines
 * libFuzzer's two entry points and forwards them to the target chosen by
 *   - the environment variable DSV4_FUZZ_TARGET=<name> (inherited by libFuzzer's -fork and -merge workers), or
 *   - the program's name, fuzz_<name> (a link to fuzz_all).
 * Nothing else changes: the chosen target sees the same calls as in its own program. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*fuzz_run_fn)(const uint8_t *data, size_t size);
typedef int (*fuzz_init_fn)(int *argc, char ***argv);

/* Every target has a run function; the init hook exists only where a target has a fixture, hence weak. */
#define FUZZ_TARGET(name)                                                \
    int fuzz_target_##name##_run(const uint8_t *data, size_t size);             \
    __attribute__((weak)) int fuzz_target_##name##_init(int *argc, char ***argv);
#include "targets.h"
#undef FUZZ_TARGET

typedef struct {
    const char  *name;
    fuzz_run_fn  run;
    fuzz_init_fn init;
} fuzz_target;

static const fuzz_target targets[] = {
#define FUZZ_TARGET(name) {#name, fuzz_target_##name##_run, fuzz_target_##name##_init},
#include "targets.h"
#undef FUZZ_TARGET
};
#define N_TARGETS (sizeof targets / sizeof targets[0])

static const fuzz_target *chosen;

static void list_targets(void) {
    fprintf(stderr, "fuzz_all: targets:");
    for (size_t i = 0; i < N_TARGETS; i++) fprintf(stderr, " %s", targets[i].name);
    fprintf(stderr, "\n");
}

static const fuzz_target *find_target(const char *name) {
    for (size_t i = 0; i < N_TARGETS; i++)
        if (!strcmp(targets[i].name, name)) return &targets[i];
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *name = getenv("DSV4_FUZZ_TARGET");
    if (!name || !*name) {
        const char *prog = strrchr((*argv)[0], '/');
        prog = prog ? prog + 1 : (*argv)[0];
        if (strncmp(prog, "fuzz_", 5) == 0 && strcmp(prog, "fuzz_all") != 0) name = prog + 5;
    }
    if (!name || !*name) {
        fprintf(stderr, "fuzz_all: say which target: DSV4_FUZZ_TARGET=<name> fuzz_all [libFuzzer flags] or a "
                        "link named fuzz_<name>\n");
        list_targets();
        exit(2);
    }
    chosen = find_target(name);
    if (!chosen) {
        fprintf(stderr, "fuzz_all: no target named '%s'\n", name);
        list_targets();
        exit(2);
    }
    return chosen->init ? chosen->init(argc, argv) : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return chosen->run(data, size); }
