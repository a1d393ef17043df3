/* The server's request parser (server/request.c: server_parse_request, pure: no engine, no tokenizer) fed
 * arbitrary bodies. Input: one byte selecting the API (0 chat completions, 1 completions, 2 Anthropic
 * messages), then the body. Invariants: the result is success or a 4xx; an error has a type, a non-empty
 * one-line message and a one-line field name, and leaves nothing allocated; a success carries a prompt (text or
 * ids), n and the stop strings within the limits, and a thinking prompt ends with <think>. */
#include "fuzz.h"
#include "server/request.h"
#include "text/chat.h"
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const server_api api = (server_api)(data[0] % 3);
    const server_parse_limits lim = {.max_n = 8, .max_stop = 4, .max_top_logprobs = 20, .served_model = "m",
                                     .encoder_0731 = (data[0] >> 2) & 1};
    server_request r;
    server_error e;
    const int rc = server_parse_request(api, (const char *)data + 1, size - 1, &lim, &r, &e);
    if (rc) {
        FUZZ_CHECK(rc >= 400 && rc < 500 && rc == e.status, "status %d (error status %d)", rc, e.status);
        FUZZ_CHECK(e.type[0] && e.message[0], "empty error type or message");
        FUZZ_CHECK(!strchr(e.message, '\n') && !strchr(e.param, '\n'), "multi-line error: %s", e.message);
        FUZZ_CHECK(!r.prompt_text && !r.prompt_ids && !r.stop && !r.model, "a failed parse left memory behind");
        return 0;
    }
    FUZZ_CHECK(r.prompt_text || (r.prompt_ids && r.n_prompt_ids > 0), "no prompt");
    FUZZ_CHECK(r.n >= 1 && r.n <= lim.max_n, "n = %d", r.n);
    FUZZ_CHECK(r.n_stop >= 0 && r.n_stop <= lim.max_stop, "n_stop = %d", r.n_stop);
    for (int i = 0; i < r.n_stop; i++) FUZZ_CHECK(r.stop[i] && r.stop[i][0], "empty stop string %d", i);
    FUZZ_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= lim.max_top_logprobs, "top_logprobs = %d", r.top_logprobs);
    if (r.thinking && r.prompt_text) {
        const size_t n = strlen(r.prompt_text), k = strlen(DSV4_THINK_TEXT);
        FUZZ_CHECK(n >= k && !memcmp(r.prompt_text + n - k, DSV4_THINK_TEXT, k), "thinking prompt without <think>");
    }
    server_request_free(&r);
    return 0;
}
