/* See constraint_hook.h: no constrained decoding in this build yet, so every constraint is refused. */
#include "server/constraint_hook.h"

int server_constraint_check(server_constraint_kind kind, const json_t *spec, const char *param, server_error *e) {
    (void)spec;
    const char *what = kind == SERVER_CONSTRAINT_TOOL_REQUIRED ? "a required tool call"
                     : kind == SERVER_CONSTRAINT_TOOL_NAMED    ? "a named tool choice"
                                                                : "a response_format other than text";
    return server_fail(e, 400, "invalid_request_error", param,
                       "%s: %s needs constrained decoding, which is not supported yet by this server", param, what);
}
