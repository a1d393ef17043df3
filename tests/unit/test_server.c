/* The server's pure parts (issue 12), without HTTP or a model:
 *   - server_parse_request: valid requests of the three APIs give the prompt dsv4_chat_render_request gives
 *     for the equivalent conversation (Anthropic blocks -> OpenAI messages); a table of bad bodies gives the
 *     status and the field; arbitrary byte strings (every prefix of valid bodies, flipped bytes) never crash
 *     and always give either success or a 4xx;
 *   - server_output: a DSML tool-call reply, fed token by token, gives the call (name, JSON arguments) and the
 *     content before it; reasoning and content are split in thinking mode; stop strings cut the content before
 *     the match, also across token boundaries; multi-byte characters are never split in a delta;
 *   - tool calls stream (a scripted DSML reply fed token by token through the real stream builders): OpenAI
 *     chunks announce the call (id, name) before its invoke closes and then send arguments fragments; Anthropic
 *     opens a tool_use block and sends input_json_delta pieces; both concatenate to the call's arguments;
 *   - server_logits_apply: presence / frequency penalties by hand-computed numbers; the mask; log-probabilities
 *     sum to 1 and the top list is sorted;
 *   - server_key_equal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "server/api.h"
#include "server/http.h"
#include "server/logits.h"
#include "server/output.h"
#include "server/request.h"
#include "text/chat.h"

#define FW "\xef\xbd\x9c"
#define D FW "DSML" FW
#define BOS "<" FW "begin\xe2\x96\x81of\xe2\x96\x81sentence" FW ">"
#define EOS "<" FW "end\xe2\x96\x81of\xe2\x96\x81sentence" FW ">"
#define USER "<" FW "User" FW ">"
#define ASSIST "<" FW "Assistant" FW ">"

static const server_parse_limits LIM = {.max_n = 8, .max_stop = 4, .max_top_logprobs = 20, .served_model = "m"};

/* ---- parsing: what the prompt becomes ---------------------------------------------------------------------- */

static char *render_ref(const char *request_json) {
    json_t *req = json_loads(request_json, 0, NULL);
    assert_non_null(req);
    char *out = NULL;
    size_t len;
    dsv4_error err;
    assert_int_equal(dsv4_chat_render_request(req, &out, &len, &err), 0);
    json_decref(req);
    return out;
}

static void parse_ok(server_api api, const char *body, server_request *r) {
    server_error e;
    const int rc = server_parse_request(api, body, strlen(body), &LIM, r, &e);
    if (rc) fprintf(stderr, "unexpected error %d: %s\n", rc, e.message);
    assert_int_equal(rc, 0);
}

static void chat_prompt_is_the_chat_encoding(void **state) {
    (void)state;
    server_request r;
    parse_ok(SERVER_API_CHAT,
             "{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
             " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hel\"}, {\"type\": \"text\", \"text\": \"lo\"}]}],"
             " \"temperature\": 0, \"max_tokens\": 5, \"n\": 2, \"stop\": \"xy\", \"seed\": 9, \"logprobs\": true, \"top_logprobs\": 3}",
             &r);
    char *want = render_ref("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"hello\"}]}");
    assert_string_equal(r.prompt_text, want);
    assert_string_equal(r.prompt_text, BOS "Be brief." USER "hello" ASSIST "</think>");
    assert_int_equal(r.thinking, 0);
    assert_true(r.sampling.temperature == 0.0f);
    assert_int_equal(r.max_tokens, 5);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "xy");
    assert_true(r.seed_given && r.sampling.seed == 9);
    assert_true(r.logprobs && r.top_logprobs == 3);
    free(want);
    server_request_free(&r);
    /* thinking with an effort, and max_completion_tokens wins over max_tokens */
    parse_ok(SERVER_API_CHAT,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"reasoning_effort\": \"high\","
             " \"max_tokens\": 3, \"max_completion_tokens\": 7}", &r);
    want = render_ref("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"mode\": \"thinking\", \"effort\": \"high\"}");
    assert_string_equal(r.prompt_text, want);
    assert_int_equal(r.thinking, 1);
    assert_int_equal(r.max_tokens, 7);
    free(want);
    server_request_free(&r);
}

static void anthropic_blocks_become_openai_messages(void **state) {
    (void)state;
    server_request r;
    parse_ok(SERVER_API_MESSAGES,
             "{\"model\": \"m\", \"max_tokens\": 9, \"system\": [{\"type\": \"text\", \"text\": \"S\"}],"
             " \"tools\": [{\"name\": \"f\", \"description\": \"d\", \"input_schema\": {\"type\": \"object\"}}],"
             " \"messages\": [{\"role\": \"user\", \"content\": \"q\"},"
             "  {\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", \"thinking\": \"hm\", \"signature\": \"\"},"
             "    {\"type\": \"text\", \"text\": \"ok\"}, {\"type\": \"tool_use\", \"id\": \"t1\", \"name\": \"f\", \"input\": {\"a\": 1}}]},"
             "  {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"t1\", \"content\": \"R\"}]}],"
             " \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 100}, \"stop_sequences\": [\"zz\"]}", &r);
    char *want = render_ref(
        "{\"mode\": \"thinking\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
        " \"parameters\": {\"type\": \"object\"}}}], \"messages\": [{\"role\": \"system\", \"content\": \"S\"},"
        " {\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"ok\", \"reasoning_content\": \"hm\","
        " \"tool_calls\": [{\"id\": \"t1\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\":1}\"}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"t1\", \"content\": \"R\"}]}");
    assert_string_equal(r.prompt_text, want);
    assert_int_equal(r.parse_tools, 1);
    assert_int_equal(r.max_tokens, 9);
    assert_string_equal(r.stop[0], "zz");
    free(want);
    server_request_free(&r);
}

static void response_format_is_kept_and_rendered(void **state) {
    (void)state;
    server_request r;
    parse_ok(SERVER_API_CHAT,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"response_format\": {\"type\": \"json_schema\","
             " \"json_schema\": {\"name\": \"p\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}}", &r);
    assert_non_null(r.response_format);
    char *want = render_ref("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"response_format\": {\"type\": \"json_schema\","
                            " \"json_schema\": {\"name\": \"p\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}}");
    assert_string_equal(r.prompt_text, want);
    free(want);
    server_request_free(&r);
    parse_ok(SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"response_format\": {\"type\": \"text\"}}", &r);
    assert_null(r.response_format);
    server_request_free(&r);
    /* thinking mode: kept too (the grammar leaves the reasoning free, constraint_hook.h) */
    parse_ok(SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"thinking\": true,"
             " \"response_format\": {\"type\": \"json_object\"}}", &r);
    assert_non_null(r.response_format);
    assert_int_equal(r.thinking, 1);
    want = render_ref("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"mode\": \"thinking\","
                      " \"response_format\": {\"type\": \"json_object\"}}");
    assert_string_equal(r.prompt_text, want);
    free(want);
    server_request_free(&r);
    /* Anthropic: output_config.format (and the beta's output_format), rendered as the client gave it */
    const char *fmt = "{\"type\": \"json_schema\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}";
    for (int beta = 0; beta < 2; beta++) {
        char body[512], ref[512];
        snprintf(body, sizeof body, "{\"max_tokens\": 9, \"messages\": [{\"role\": \"user\", \"content\": \"q\"}],"
                 " \"thinking\": {\"type\": \"enabled\"}, %s%s%s}", beta ? "\"output_format\": " : "\"output_config\": {\"format\": ",
                 fmt, beta ? "" : "}");
        parse_ok(SERVER_API_MESSAGES, body, &r);
        assert_non_null(r.response_format);
        assert_int_equal(r.thinking, 1);
        assert_string_equal(r.rf_param, beta ? "output_format" : "output_config.format");
        snprintf(ref, sizeof ref, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"mode\": \"thinking\", \"response_format\": %s}", fmt);
        want = render_ref(ref);
        assert_string_equal(r.prompt_text, want);
        free(want);
        server_request_free(&r);
    }
}

static void completions_ids_and_text(void **state) {
    (void)state;
    server_request r;
    parse_ok(SERVER_API_COMPLETIONS, "{\"prompt\": [3, 4, 5], \"max_tokens\": 2, \"echo\": true, \"logprobs\": 2}", &r);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 5);
    assert_null(r.prompt_text);
    assert_true(r.echo && r.logprobs && r.top_logprobs == 2);
    server_request_free(&r);
    parse_ok(SERVER_API_COMPLETIONS, "{\"prompt\": [\"abc\"]}", &r);
    assert_string_equal(r.prompt_text, "abc");
    assert_int_equal(r.max_tokens, 16);   /* the OpenAI default */
    server_request_free(&r);
}

typedef struct {
    server_api api;
    const char *body;
    int status;
    const char *param;
} bad_case;

static const bad_case BAD[] = {
    {SERVER_API_CHAT, "", 400, ""},
    {SERVER_API_CHAT, "{", 400, ""},
    {SERVER_API_CHAT, "null", 400, ""},
    {SERVER_API_CHAT, "{\"messages\": 3}", 400, "messages"},
    {SERVER_API_CHAT, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages[0].role"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, 7]}", 400, "messages[1]"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}", 400, "messages[0].tool_calls"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": 3}}]}]}", 400, "messages[0].tool_calls[0]"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"seed\": \"1\"}", 400, "seed"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_k\": -2}", 400, "top_k"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"min_p\": 1}", 400, "min_p"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": 1}", 400, "stream"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 9}", 400, "n"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": 5}", 400, "stop"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"thinking\": {\"type\": \"maybe\"}}", 400, "thinking.type"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {}}]}", 400, "tools[0].function.name"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}", 400, "tool_choice"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\"}}", 400, "response_format.json_schema"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"schema\": {\"type\": \"string\", \"format\": \"email\"}}}}", 400, "response_format.json_schema.schema"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"output_config\": 5}", 400, "output_config"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"output_config\": {\"format\": {\"type\": \"json_object\"}}}", 400, "output_config.format.type"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"output_config\": {\"format\": {\"type\": \"json_schema\"}}}", 400, "output_config.format.schema"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"output_format\": {\"type\": \"json_schema\", \"schema\": {\"type\": \"string\", \"format\": \"email\"}}}", 400, "output_format.schema"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"output_format\": {\"type\": \"json_schema\", \"schema\": {}}, \"output_config\": {\"format\": {\"type\": \"json_schema\", \"schema\": {}}}}", 400, "output_format"},
    {SERVER_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"yaml\"}}", 400, "response_format.type"},
    {SERVER_API_CHAT, "{\"model\": \"other\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 404, "model"},
    {SERVER_API_COMPLETIONS, "{\"prompt\": 5}", 400, "prompt"},
    {SERVER_API_COMPLETIONS, "{\"prompt\": [1, 2.5]}", 400, "prompt[1]"},
    {SERVER_API_COMPLETIONS, "{\"prompt\": \"a\", \"logprobs\": true}", 400, "logprobs"},
    {SERVER_API_COMPLETIONS, "{\"prompt\": \"a\", \"suffix\": \"b\"}", 400, "suffix"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]}", 400, "messages[0].content[0]"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_use\", \"id\": \"a\", \"name\": \"b\", \"input\": {}}]}]}", 400, "messages[0].content[0]"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"temperature\": 1.5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 400, "temperature"},
    {SERVER_API_MESSAGES, "{\"max_tokens\": 1, \"tool_choice\": {\"type\": \"tool\", \"name\": \"f\"}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 400, "tool_choice"},
};

static void bad_requests_name_the_field(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        server_request r;
        server_error e;
        const int rc = server_parse_request(BAD[i].api, BAD[i].body, strlen(BAD[i].body), &LIM, &r, &e);
        if (rc != BAD[i].status || strcmp(e.param, BAD[i].param))
            fprintf(stderr, "case %zu (%s): got %d param '%s' (%s)\n", i, BAD[i].body, rc, e.param, e.message);
        assert_int_equal(rc, BAD[i].status);
        assert_string_equal(e.param, BAD[i].param);
        assert_true(strlen(e.message) > 0);
        assert_null(r.prompt_text);   /* nothing left allocated */
    }
}

/* Fuzz-style robustness: every prefix of valid bodies and single-byte corruptions parse or fail with a 4xx. */
static void arbitrary_bytes_never_crash(void **state) {
    (void)state;
    const char *bodies[] = {
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"h\\u00e9\"}]}], \"tools\": "
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}], \"stop\": [\"a\"]}",
        "{\"max_tokens\": 3, \"system\": \"s\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\","
        " \"tool_use_id\": \"x\", \"content\": [{\"type\": \"text\", \"text\": \"r\"}], \"is_error\": true}]}]}",
        "{\"prompt\": [1, 2, 3], \"n\": 2, \"logprobs\": 1, \"echo\": true, \"stream\": true, \"stream_options\": {\"include_usage\": true}}",
    };
    const server_api apis[] = {SERVER_API_CHAT, SERVER_API_MESSAGES, SERVER_API_COMPLETIONS};
    char buf[1024];
    for (int b = 0; b < 3; b++) {
        const size_t n = strlen(bodies[b]);
        for (int a = 0; a < 3; a++) {
            for (size_t k = 0; k <= n; k++) {
                server_request r;
                server_error e;
                const int rc = server_parse_request(apis[a], bodies[b], k, &LIM, &r, &e);
                assert_true(rc == 0 || (rc >= 400 && rc < 500));
                server_request_free(&r);
            }
            for (size_t k = 0; k < n; k++) {
                static const char flips[] = {'"', '{', '}', '[', ']', ',', ':', '\\', 'x', '\xff', '\0', '1'};
                for (size_t f = 0; f < sizeof flips; f++) {
                    memcpy(buf, bodies[b], n);
                    buf[k] = flips[f];
                    server_request r;
                    server_error e;
                    const int rc = server_parse_request(apis[a], buf, n, &LIM, &r, &e);
                    assert_true(rc == 0 || (rc >= 400 && rc < 500));
                    server_request_free(&r);
                }
            }
        }
    }
}

/* ---- output assembly ------------------------------------------------------------------------------------------- */

typedef struct {
    dsv4_tokenizer *tok;
    char path[256];
} tok_fixture;

static int tok_setup(void **state) {
    tok_fixture *f = calloc(1, sizeof *f);
    const char *root = getenv("DSV4_ROOT");
    char src[1024];
    snprintf(src, sizeof src, "%s/tests/data/text/tiny_tokenizer.json", root ? root : ".");
    json_t *t = json_load_file(src, 0, NULL);
    if (!t) return -1;
    const char *marks[] = {BOS, EOS, USER, ASSIST, "<think>", "</think>", FW "DSML" FW};
    json_t *added = json_object_get(t, "added_tokens");
    for (int i = 0; i < 7; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 264 + i, "content", marks[i],
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    snprintf(f->path, sizeof f->path, "/tmp/dsv4_test_server_%d.json", (int)getpid());
    const int rc = json_dump_file(t, f->path, 0);
    json_decref(t);
    dsv4_error err;
    if (rc || dsv4_tokenizer_load(f->path, NULL, &f->tok, &err)) return -1;
    *state = f;
    return 0;
}

static int tok_teardown(void **state) {
    tok_fixture *f = *state;
    dsv4_tokenizer_free(f->tok);
    unlink(f->path);
    free(f);
    return 0;
}

/* Encode text (markers matched) and push it token by token. */
static int push_text(server_output *o, const dsv4_tokenizer *t, const char *text) {
    int32_t *ids = NULL;
    size_t n = 0;
    dsv4_error err;
    assert_int_equal(dsv4_tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &err), 0);
    int stopped = 0;
    for (size_t i = 0; i < n && !stopped; i++) stopped = server_output_push(o, ids[i]);
    free(ids);
    return stopped;
}

static void tool_call_from_tokens(void **state) {
    tok_fixture *f = *state;
    server_output o;
    const int32_t skip[] = {265, 266};
    assert_int_equal(server_output_init(&o, f->tok, 1, 1, NULL, 0, skip, 2), 0);
    push_text(&o, f->tok, "let me see</think>Checking.\n\n<" D "tool_calls>\n<" D "invoke name=\"get_weather\">\n<" D
                          "parameter name=\"city\" string=\"true\">Paris</" D "parameter>\n<" D
                          "parameter name=\"days\" string=\"false\">3</" D "parameter>\n</" D "invoke>\n</" D "tool_calls>" EOS);
    server_output_finish(&o);
    size_t n;
    const char *r = server_output_new_reasoning(&o, &n);
    assert_int_equal(n, strlen("let me see"));
    assert_memory_equal(r, "let me see", n);
    const char *c = server_output_new_content(&o, &n);
    assert_int_equal(n, strlen("Checking."));
    assert_memory_equal(c, "Checking.", n);
    assert_int_equal(o.n_calls, 1);
    assert_string_equal(o.calls[0].name, "get_weather");
    json_t *args = json_loads(o.calls[0].arguments, 0, NULL);
    assert_non_null(args);
    assert_string_equal(json_string_value(json_object_get(args, "city")), "Paris");
    assert_int_equal(json_integer_value(json_object_get(args, "days")), 3);
    json_decref(args);
    server_output_free(&o);
}

/* SSE text -> its events' data objects (skipping [DONE]); *names gets the event names when not NULL. */
static json_t *sse_objects(const char *text, json_t *names) {
    json_t *a = json_array();
    const char *p = text;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        if (strncmp(p, "[DONE]", 6)) {
            json_error_t je;
            json_t *v = json_loadb(p, (size_t)(e - p), 0, &je);
            assert_non_null(v);
            json_array_append_new(a, v);
        }
        p = e;
    }
    if (names)
        for (p = text; (p = strstr(p, "event: ")); p += 7) {
            const char *e = strchr(p + 7, '\n');
            json_array_append_new(names, json_stringn(p + 7, (size_t)(e - p - 7)));
        }
    return a;
}

static void tool_calls_stream_as_deltas(void **state) {
    tok_fixture *f = *state;
    /* a reply whose second call has a long string value: it must go out in pieces, before the call closes */
    const char *reply = "Sure.\n\n<" D "tool_calls>\n<" D "invoke name=\"get_weather\">\n<" D
                        "parameter name=\"city\" string=\"true\">Paris</" D "parameter>\n</" D "invoke>\n<" D
                        "invoke name=\"write_file\">\n<" D "parameter name=\"text\" string=\"true\">abc abc \"abc\" abc\nabc abc "
                        "abc abc abc abc abc abc</" D "parameter>\n<" D "parameter name=\"n\" string=\"false\">[1, 2]</" D
                        "parameter>\n</" D "invoke>\n</" D "tool_calls>" EOS;
    int32_t *ids = NULL;
    size_t n = 0;
    dsv4_error err;
    assert_int_equal(dsv4_tokenizer_encode(f->tok, reply, strlen(reply), 0, &ids, &n, &err), 0);
    const size_t close2 = strstr(reply, "</" D "invoke>\n</") - reply;   /* where the second invoke closes */
    for (int api = 0; api < 2; api++) {
        server_ctx srv;
        memset(&srv, 0, sizeof srv);
        srv.model_name = "m";
        server_session s;
        memset(&s, 0, sizeof s);
        s.srv = &srv;
        s.req.n = 1;
        strcpy(s.id, "x");
        server_choice ch;
        memset(&ch, 0, sizeof ch);
        s.ch = &ch;
        const int32_t skip[] = {265, 266};
        assert_int_equal(server_output_init(&ch.out, f->tok, 1, 0, NULL, 0, skip, 2), 0);
        dsv4_strbuf sse;
        dsv4_sb_init(&sse);
        size_t sse_at_close = 0, text_len = 0;
        for (size_t i = 0; i < n; i++) {
            server_output_push(&ch.out, ids[i]);
            if (api == 0) openai_chat_stream(&s, &sse);
            else anthropic_message_stream(&s, &sse);
            /* the stream so far, up to the token before the one that closes the second invoke */
            char *piece = NULL;
            size_t pl = 0;
            if (dsv4_tokenizer_decode(f->tok, &ids[i], 1, &piece, &pl, &err) == 0) text_len += pl;
            free(piece);
            if (text_len <= close2) sse_at_close = sse.len;
        }
        server_output_finish(&ch.out);
        ch.end = SERVER_END_EOS;
        if (api == 0) openai_chat_stream(&s, &sse);
        else anthropic_message_stream(&s, &sse);
        assert_int_equal(ch.out.n_calls, 2);
        json_t *names = api ? json_array() : NULL;
        json_t *ev = sse_objects(sse.data, names);
        char *early = strndup(sse.data, sse_at_close);
        /* per call: the announced name and the concatenated argument pieces */
        char args[2][512] = {"", ""}, name[2][32] = {"", ""};
        int pieces[2] = {0, 0}, early_pieces = 0, stops = 0;
        for (size_t k = 0; k < json_array_size(ev); k++) {
            json_t *e = json_array_get(ev, k);
            if (api == 0) {
                json_t *tc = json_object_get(json_object_get(json_array_get(json_object_get(e, "choices"), 0), "delta"), "tool_calls");
                for (size_t j = 0; j < json_array_size(tc); j++) {
                    json_t *c = json_array_get(tc, j);
                    const int idx = (int)json_integer_value(json_object_get(c, "index"));
                    assert_true(idx == 0 || idx == 1);
                    json_t *fn = json_object_get(c, "function");
                    if (json_object_get(fn, "name")) {
                        assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
                        assert_non_null(json_string_value(json_object_get(c, "id")));
                        strcpy(name[idx], json_string_value(json_object_get(fn, "name")));
                    }
                    strcat(args[idx], json_string_value(json_object_get(fn, "arguments")));
                    pieces[idx]++;
                }
            } else {
                const char *type = json_string_value(json_object_get(e, "type"));
                assert_string_equal(type, json_string_value(json_array_get(names, k)));
                const int idx = (int)json_integer_value(json_object_get(e, "index")) - 1;   /* block 0 is the text */
                if (!strcmp(type, "content_block_start") && idx >= 0) {
                    json_t *b = json_object_get(e, "content_block");
                    assert_string_equal(json_string_value(json_object_get(b, "type")), "tool_use");
                    strcpy(name[idx], json_string_value(json_object_get(b, "name")));
                }
                json_t *d = json_object_get(e, "delta");
                if (!strcmp(type, "content_block_delta") && !strcmp(json_string_value(json_object_get(d, "type")), "input_json_delta")) {
                    assert_true(idx == 0 || idx == 1);
                    strcat(args[idx], json_string_value(json_object_get(d, "partial_json")));
                    pieces[idx]++;
                }
                if (!strcmp(type, "content_block_stop")) stops++;
            }
        }
        for (int c = 0; c < 2; c++) {
            assert_string_equal(name[c], ch.out.calls[c].name);
            assert_string_equal(args[c], ch.out.calls[c].arguments);
        }
        assert_true(pieces[1] >= 3);   /* the long value came in several pieces */
        /* before the second invoke closed, the stream had announced it and sent part of its arguments */
        assert_non_null(strstr(early, "write_file"));
        /* before the second invoke closed, the stream had announced it and sent pieces of its long value */
        assert_non_null(strstr(early, "write_file"));
        const char *needle = api ? "\"index\":2,\"delta\":{\"type\":\"input_json_delta\"" : "\"index\":1,\"function\":{\"arguments\"";
        for (const char *q = early; (q = strstr(q, needle)); q++) early_pieces++;
        assert_true(early_pieces >= 5);
        /* DSV4_SSE_DIR: leave the stream and the calls for tests/node/tool_stream_sdk.sh, which reads them back
         * with the official SDKs */
        const char *dir = getenv("DSV4_SSE_DIR");
        if (dir) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s.sse", dir, api ? "anthropic" : "openai");
            FILE *fp = fopen(path, "wb");
            assert_non_null(fp);
            fwrite(sse.data, 1, sse.len, fp);
            fclose(fp);
            snprintf(path, sizeof path, "%s/calls.json", dir);
            json_t *calls = json_array();
            for (int k = 0; k < ch.out.n_calls; k++)
                json_array_append_new(calls, json_pack("{s:s, s:s}", "name", ch.out.calls[k].name, "arguments", ch.out.calls[k].arguments));
            assert_int_equal(json_dump_file(calls, path, 0), 0);
            json_decref(calls);
        }
        if (api == 1) assert_int_equal(stops, 3);   /* text, two tool_use blocks */
        free(early);
        json_decref(ev);
        json_decref(names);
        dsv4_sb_free(&sse);
        server_output_free(&ch.out);
    }
    free(ids);
}

static void malformed_dsml_is_shown_as_content(void **state) {
    tok_fixture *f = *state;
    server_output o;
    assert_int_equal(server_output_init(&o, f->tok, 1, 0, NULL, 0, NULL, 0), 0);
    push_text(&o, f->tok, "ab\n\n<" D "tool_calls>\nxyz");
    server_output_finish(&o);
    size_t n;
    const char *c = server_output_new_content(&o, &n);
    const char *want = "ab\n\n<" D "tool_calls>\nxyz";
    assert_int_equal(n, strlen(want));
    assert_memory_equal(c, want, n);
    assert_int_equal(o.n_calls, 0);
    server_output_free(&o);
}

static void stop_strings_cut_before_the_match(void **state) {
    tok_fixture *f = *state;
    char *stops[] = {"cd", "zzz"};
    server_output o;
    assert_int_equal(server_output_init(&o, f->tok, 0, 0, stops, 2, NULL, 0), 0);
    /* the content released while streaming never contains a stop string's start that may still complete */
    assert_int_equal(push_text(&o, f->tok, "abc"), 0);
    size_t n;
    const char *c = server_output_new_content(&o, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(c, "ab", 2);
    assert_int_equal(push_text(&o, f->tok, "dXY"), 1);
    server_output_finish(&o);
    c = server_output_new_content(&o, &n);
    assert_int_equal(n, 0);
    assert_int_equal(o.content.len, 2);
    assert_int_equal(o.stop_index, 0);
    server_output_free(&o);
    /* no match: everything comes out at the end, multi-byte characters whole */
    assert_int_equal(server_output_init(&o, f->tok, 0, 0, stops, 2, NULL, 0), 0);
    push_text(&o, f->tok, "a\xc3\xa9z\xc3\xa9zz");
    c = server_output_new_content(&o, &n);
    json_t *j = server_json_text(c, n);   /* valid UTF-8 so far */
    assert_non_null(j);
    assert_int_equal(json_string_length(j), n);
    json_decref(j);
    server_output_finish(&o);
    assert_string_equal(o.content.data, "a\xc3\xa9z\xc3\xa9zz");
    server_output_free(&o);
}

static void json_text_replaces_ill_formed_bytes(void **state) {
    (void)state;
    json_t *j = server_json_text("a\xff" "b\xc3", 4);
    assert_string_equal(json_string_value(j), "a\xef\xbf\xbd" "b\xef\xbf\xbd");
    json_decref(j);
}

/* ---- logits ----------------------------------------------------------------------------------------------------- */

static void penalties_and_mask(void **state) {
    (void)state;
    float l[6] = {1, 2, 3, 4, 5, 6};
    const int32_t gen[] = {1, 1, 3};
    server_logits_proc p = {.mask_from = 5, .presence = 0.5f, .frequency = 0.25f};
    assert_int_equal(server_logits_apply(&p, gen, 3, l, 6), 0);
    assert_true(l[0] == 1.0f);
    assert_true(l[1] == 2.0f - 0.5f - 0.5f);     /* twice: frequency 2 * 0.25 + presence 0.5 */
    assert_true(l[2] == 3.0f);
    assert_true(l[3] == 4.0f - 0.25f - 0.5f);
    assert_true(l[4] == 5.0f);
    assert_true(isinf(l[5]) && l[5] < 0);
    /* counts are cleared after each call: a second call penalises the same again, not twice as much */
    float l2[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(server_logits_apply(&p, gen, 3, l2, 6), 0);
    assert_true(l2[1] == 1.0f);
    server_logits_proc_free(&p);
    /* no penalty, nothing masked: the row is untouched */
    float l3[3] = {0.1f, 0.2f, 0.3f};
    server_logits_proc q = {.mask_from = 3};
    assert_int_equal(server_logits_apply(&q, gen, 3, l3, 3), 0);
    assert_true(l3[0] == 0.1f && l3[1] == 0.2f && l3[2] == 0.3f);
}

static void logprobs_are_normalised(void **state) {
    (void)state;
    const float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, 0.0f};
    server_logprob top[5];
    const float lp = server_logprobs(l, 5, 4, 3, top);
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp((double)l[i]);
    assert_true(fabs(lp - (0.0 - log(z))) < 1e-5);
    assert_int_equal(top[0].id, 1);   /* ties: the lower id first */
    assert_int_equal(top[1].id, 3);
    assert_int_equal(top[2].id, 0);
    assert_true(fabs(top[0].logprob - (2.0 - log(z))) < 1e-5);
    double s = 0;
    for (int i = 0; i < 5; i++) { server_logprob t[1]; s += exp(server_logprobs(l, 5, i, 0, t)); }
    assert_true(fabs(s - 1.0) < 1e-5);
}

static void keys_compare_whole(void **state) {
    (void)state;
    assert_true(server_key_equal("secret", "secret"));
    assert_false(server_key_equal("secre", "secret"));
    assert_false(server_key_equal("secrets", "secret"));
    assert_false(server_key_equal("", "secret"));
    assert_false(server_key_equal("Secret", "secret"));
}

int main(void) {
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(chat_prompt_is_the_chat_encoding),
        cmocka_unit_test(anthropic_blocks_become_openai_messages),
        cmocka_unit_test(response_format_is_kept_and_rendered),
        cmocka_unit_test(completions_ids_and_text),
        cmocka_unit_test(bad_requests_name_the_field),
        cmocka_unit_test(arbitrary_bytes_never_crash),
        cmocka_unit_test(json_text_replaces_ill_formed_bytes),
        cmocka_unit_test(penalties_and_mask),
        cmocka_unit_test(logprobs_are_normalised),
        cmocka_unit_test(keys_compare_whole),
    };
    const struct CMUnitTest with_tokenizer[] = {
        cmocka_unit_test(tool_call_from_tokens),
        cmocka_unit_test(tool_calls_stream_as_deltas),
        cmocka_unit_test(malformed_dsml_is_shown_as_content),
        cmocka_unit_test(stop_strings_cut_before_the_match),
    };
    int rc = cmocka_run_group_tests(pure, NULL, NULL);
    rc |= cmocka_run_group_tests(with_tokenizer, tok_setup, tok_teardown);
    return rc;
}
