/* Checks several targets share. */
#ifndef DSV4_TESTS_FUZZ_CHECKS_H
#define DSV4_TESTS_FUZZ_CHECKS_H
#include "model/safetensors.h"

/* Every tensor of an opened archive lies inside its shard's mapping, with a size that matches its shape and
 * dtype; the table is sorted, unique and searchable. Touches each tensor's first and last byte. */
void fuzz_check_archive(const st_archive *a);
#endif
