/* Replay driver: links a fuzz target without libFuzzer and feeds it files, so the normal test suite (any
 * compiler, with or without sanitizers) runs every committed corpus and regression input.
 *   fuzz_X FILE_OR_DIR...   each file is one input; a folder's files are replayed in name order
 * Prints "N passed, 0 failed"; a finding aborts (sanitizer report or FUZZ_CHECK), which the runner counts. */
#define _GNU_SOURCE
#include "../fuzz.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Targets without a fixture do not define the init hook. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static long replayed;

static void replay_file(const char *path) {
    size_t n;
    char *buf = fuzz_read_file(path, &n);
    /* an exact-size copy, so ASan sees reads past the input's end (the file buffer has a NUL after it) */
    uint8_t *in = malloc(n ? n : 1);
    if (!in) abort();
    memcpy(in, buf, n);
    free(buf);
    if (getenv("FUZZ_REPLAY_VERBOSE")) fprintf(stderr, "replay %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(in, n);
    free(in);
    replayed++;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static void replay_path(const char *path) {
    struct stat st;
    if (stat(path, &st)) return;   /* a target may have no regression folder yet */
    if (!S_ISDIR(st.st_mode)) { replay_file(path); return; }
    struct dirent **ents;
    int n = scandir(path, &ents, NULL, by_name);
    for (int i = 0; i < n; i++) {
        if (ents[i]->d_name[0] != '.') {
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", path, ents[i]->d_name);
            replay_path(sub);
        }
        free(ents[i]);
    }
    free(ents);
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) replay_path(argv[i]);
    printf("%ld passed, 0 failed\n", replayed);
    return 0;
}
