/* model.safetensors.index.json + shards (model/safetensors.c: st_open_dir). Fixture (built once): the two shards
 * of the tiny checkpoint in a temp folder. Input: the index text; it may name any file, real or not. */
#include "fuzz.h"
#include "lib/checks.h"
#include <stdio.h>
#include <stdlib.h>

static char dir[4200];   /* the fixture folder */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    dsv4_error err;
    snprintf(dir, sizeof dir, "%s/ck", fuzz_tmpdir());
    if (fuzz_tiny_write(dir, 2, &err)) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    fuzz_write_file(path, data, size);
    st_archive a;
    dsv4_error err = {0};
    int rc = st_open_dir(dir, &a, &err);
    if (rc) { fuzz_check_error(rc, &err); return 0; }
    fuzz_check_archive(&a);
    st_close(&a);
    return 0;
}
