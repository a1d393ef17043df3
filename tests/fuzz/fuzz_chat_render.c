/* The V4 chat encoding of arbitrary messages JSON (text/chat.c). Input: one selector byte, then JSON text.
 *   selector bit 0 = 0: the text is a request object (dsv4_chat_render_request, what `dsv4 render` reads);
 *   selector bit 0 = 1: the text is the messages array (dsv4_chat_render), options from bits 1..6
 *                       (thinking, drop_thinking, add_bos, encoder, effort none/low/high/max).
 * A rendered prompt is valid UTF-8 without NUL bytes (JSON strings are), and rendering is deterministic. */
#include "fuzz.h"
#include "text/chat.h"
#include "text/utf8.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int render(const json_t *j, int as_messages, const dsv4_chat_opts *o, char **out, size_t *len,
                  dsv4_error *err) {
    return as_messages ? dsv4_chat_render(j, o, out, len, err) : dsv4_chat_render_request(j, out, len, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const unsigned sel = data[0];
    json_t *j = json_loadb((const char *)data + 1, size - 1, 0, NULL);
    if (!j) return 0;
    static const char *const efforts[4] = {NULL, "low", "high", "max"};
    dsv4_chat_opts o;
    dsv4_chat_opts_default(&o);
    o.thinking = sel >> 1 & 1;
    o.drop_thinking = sel >> 2 & 1;
    o.add_bos = sel >> 3 & 1;
    o.encoder = sel >> 4 & 1 ? DSV4_CHAT_V4_0731 : DSV4_CHAT_V4;
    o.effort = efforts[sel >> 5 & 3];
    char *out;
    size_t len;
    dsv4_error err = {0};
    int rc = render(j, sel & 1, &o, &out, &len, &err);
    if (rc) {
        fuzz_check_error(rc, &err);
    } else {
        FUZZ_CHECK(strlen(out) == len, "prompt has a NUL byte at %zu of %zu", strlen(out), len);
        FUZZ_CHECK(dsv4_utf8_valid_prefix(out, len) == len, "prompt is not valid UTF-8");
        char *again;
        size_t len2;
        FUZZ_CHECK(render(j, sel & 1, &o, &again, &len2, &err) == 0, "second render failed: %s", err.msg);
        FUZZ_CHECK(len2 == len && !memcmp(out, again, len), "two renders differ");
        free(again);
        free(out);
    }
    json_decref(j);
    return 0;
}
