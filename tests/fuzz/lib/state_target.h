/* The body of the state-file targets (fuzz_state.c, fuzz_state_sum.c), which differ only in whether the
 * checksum is recomputed after mutation (lib/state_target.c). */
#ifndef DSV4_TESTS_FUZZ_STATE_TARGET_H
#define DSV4_TESTS_FUZZ_STATE_TARGET_H
#include <stddef.h>
#include <stdint.h>

void fuzz_state_init(void);
/* fix_checksum: overwrite the input's last 8 bytes with the XXH64 of the bytes before them, so a mutation of
 * the header or the body reaches the parser instead of stopping at the checksum. */
void fuzz_state_one(const uint8_t *data, size_t size, int fix_checksum);
#endif
