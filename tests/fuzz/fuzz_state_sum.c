/* Saved sequence states with the XXH64 trailer recomputed after mutation: the checksum must not be the only
 * thing between a damaged (or hand-made) file and memory safety (lib/state_target.c has the checks). */
#include "fuzz.h"
#include "lib/state_target.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fuzz_state_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_state_one(data, size, 1);
    return 0;
}
