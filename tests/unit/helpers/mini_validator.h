/* An independent JSON Schema validator for the subset the constraint engine supports (tests only): written
 * from the JSON Schema specification, not from the engine's compiler, so that generated output is checked by
 * other code. Patterns are matched with PCRE2 (UTF + UCP), searched anywhere in the string as the
 * specification says. */
#ifndef DSV4_TEST_MINI_VALIDATOR_H
#define DSV4_TEST_MINI_VALIDATOR_H
#include <jansson.h>
#include <stddef.h>

/* 1 when value is valid against schema (root: the document that $ref pointers resolve in). On 0, why holds a
 * short reason. */
int mv_valid(const json_t *root, const json_t *schema, const json_t *value, char *why, size_t n);
#endif
