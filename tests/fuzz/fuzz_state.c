/* Saved sequence states as they come, checksum and all (lib/state_target.c has the checks). */
#include "fuzz.h"
#include "lib/state_target.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fuzz_state_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_state_one(data, size, 0);
    return 0;
}
