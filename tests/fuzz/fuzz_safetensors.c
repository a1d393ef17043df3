/* One safetensors file (model/safetensors.c: st_open_file): u64 header length, JSON header, data.
 * Input: the whole file. Whatever opens must describe bytes inside the mapping. */
#include "fuzz.h"
#include "lib/checks.h"
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[4200];
    snprintf(path, sizeof path, "%s/one.safetensors", fuzz_tmpdir());
    fuzz_write_file(path, data, size);
    st_archive a;
    dsv4_error err = {0};
    int rc = st_open_file(path, &a, &err);
    if (rc) { fuzz_check_error(rc, &err); return 0; }
    fuzz_check_archive(&a);
    st_close(&a);
    return 0;
}
