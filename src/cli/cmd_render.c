/* dsv4 render --messages FILE.json [--encoder v4|v4-0731] [--mode chat|thinking] [--effort E]
 * Prints the exact V4 prompt for a conversation, with no trailing newline (DESIGN section 7). FILE.json is the
 * shape of testdata/chat_encoding/published_N.json; the options override the file's "encoder" / "mode" / "effort". */
#include "cli/cli.h"
#include "text/chat.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *CMD = "render";

int cmd_render(int argc, char **argv) {
    const char *path = NULL, *encoder = NULL, *mode = NULL, *effort = NULL;
    for (int i = 1; i < argc; i++) {
        const char **slot = !strcmp(argv[i], "--messages") ? &path
                          : !strcmp(argv[i], "--encoder")  ? &encoder
                          : !strcmp(argv[i], "--mode")     ? &mode
                          : !strcmp(argv[i], "--effort")   ? &effort : NULL;
        if (!slot) return cli_error(CMD, "unknown option '%s'", argv[i]);
        if (!(*slot = cli_value(CMD, argc, argv, &i))) return 1;
    }
    if (!path) return cli_error(CMD, "--messages FILE.json is required");
    json_error_t je;
    json_t *req = json_load_file(path, 0, &je);
    if (!req) return cli_error(CMD, "%s: line %d: %s", path, je.line, je.text);
    if (!json_is_object(req)) {
        json_decref(req);
        return cli_error(CMD, "%s: expected a JSON object with \"messages\"", path);
    }
    if (encoder) json_object_set_new(req, "encoder", json_string(encoder));
    if (mode) json_object_set_new(req, "mode", json_string(mode));
    if (effort) json_object_set_new(req, "effort", strcmp(effort, "none") ? json_string(effort) : json_null());
    char *prompt;
    size_t len;
    dsv4_error err;
    int rc = dsv4_chat_render_request(req, &prompt, &len, &err);
    json_decref(req);
    if (rc) return cli_fail(CMD, &err);
    if (fwrite(prompt, 1, len, stdout) != len || fflush(stdout)) rc = cli_error(CMD, "write error: %s", strerror(errno));
    free(prompt);
    return rc;
}
