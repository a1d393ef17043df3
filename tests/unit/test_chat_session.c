/* engine/chat_session: a multi-turn chat on one sequence. After every step of a conversation the sequence must
 * hold exactly the tokens of the official rendering of the conversation so far (drop_thinking = false), so
 * incremental feeding == full render; earlier tokens never change; interrupted replies are closed so that this
 * still holds. Scripted replies are encoded canonically (that is what makes the token equality exact); sampled
 * replies are checked for bookkeeping and prefix stability. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "engine/chat_session.h"
#include "helpers/testmodel.h"
#include "text/chat.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FW "\xef\xbd\x9c"
#define BOS "<" FW "begin\xe2\x96\x81of\xe2\x96\x81sentence" FW ">"
#define EOS "<" FW "end\xe2\x96\x81of\xe2\x96\x81sentence" FW ">"
#define USER "<" FW "User" FW ">"
#define ASSIST "<" FW "Assistant" FW ">"

typedef struct {
    dsv4_model *m;
    dsv4_tokenizer *tok, *plain_tok;
    char dir[256], tok_path[320];
} fixture;

/* The small tokenizer fixture plus the V4 chat markers as added tokens (ids 264..), written next to the model. */
static int write_chat_tokenizer(const char *path) {
    const char *root = getenv("DSV4_ROOT");
    char src[1024];
    snprintf(src, sizeof src, "%s/tests/data/text/tiny_tokenizer.json", root ? root : ".");
    json_error_t je;
    json_t *t = json_load_file(src, 0, &je);
    if (!t) { fprintf(stderr, "%s: %s\n", src, je.text); return 1; }
    const char *marks[] = { BOS, EOS, USER, ASSIST, "<think>", "</think>", FW "DSML" FW };
    json_t *added = json_object_get(t, "added_tokens");
    for (int i = 0; i < 7; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 264 + i, "content",
                                               marks[i], "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    int rc = json_dump_file(t, path, 0);
    json_decref(t);
    return rc;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    dsv4_error err;
    f->m = tm_make("flash-tiny", NULL, 0, 77, DSV4_MODE_EXACT, f->dir);
    if (!f->m) return -1;
    snprintf(f->tok_path, sizeof f->tok_path, "%s/tokenizer.json", f->dir);
    if (write_chat_tokenizer(f->tok_path)) return -1;
    if (dsv4_tokenizer_load(f->tok_path, NULL, &f->tok, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    const char *root = getenv("DSV4_ROOT");
    char plain[1024];
    snprintf(plain, sizeof plain, "%s/tests/data/text/tiny_tokenizer.json", root ? root : ".");
    if (dsv4_tokenizer_load(plain, NULL, &f->plain_tok, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dsv4_tokenizer_free(f->tok);
    dsv4_tokenizer_free(f->plain_tok);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

static dsv4_chat_session *session(fixture *f, const char *system, int thinking) {
    dsv4_chat_session_opts o = { .system = system, .thinking = thinking, .sampling = { .top_p = 1.0f } };
    dsv4_chat_session *s = NULL;
    dsv4_error err;
    if (dsv4_chat_session_new(f->m, f->tok, &o, &s, &err)) fail_msg("session: %s", err.msg);
    return s;
}

/* The session's sequence == encode(official rendering of its conversation), token for token. */
static void expect_full_render(fixture *f, dsv4_chat_session *s) {
    char *text;
    size_t len, n;
    int32_t *ids;
    dsv4_error err;
    assert_int_equal(dsv4_chat_session_render_full(s, &text, &len, &err), 0);
    assert_int_equal(dsv4_tokenizer_encode(f->tok, text, len, 0, &ids, &n, &err), 0);
    if ((int64_t)n != dsv4_chat_session_position(s))
        fail_msg("position %lld, full render has %zu tokens: %s", (long long)dsv4_chat_session_position(s), n, text);
    const int32_t *have = dsv4_chat_session_tokens(s);
    for (size_t i = 0; i < n; i++)
        if (have[i] != ids[i]) fail_msg("token %zu: sequence %d, full render %d", i, have[i], ids[i]);
    free(ids);
    free(text);
}

static void scripted_reply(fixture *f, dsv4_chat_session *s, const char *text) {
    int32_t *ids;
    size_t n;
    dsv4_error err;
    assert_int_equal(dsv4_tokenizer_encode(f->tok, text, strlen(text), 0, &ids, &n, &err), 0);
    if (dsv4_chat_session_feed_reply(s, ids, (int)n, &err)) fail_msg("feed_reply: %s", err.msg);
    free(ids);
}

static void user(dsv4_chat_session *s, const char *text) {
    dsv4_error err;
    if (dsv4_chat_session_user(s, text, &err)) fail_msg("user: %s", err.msg);
}

static void close_turn(dsv4_chat_session *s) {
    dsv4_error err;
    if (dsv4_chat_session_close(s, &err)) fail_msg("close: %s", err.msg);
}

/* A copy of the sequence's tokens, to check later turns leave them untouched. */
static int32_t *snapshot_tokens(dsv4_chat_session *s, int64_t *n) {
    *n = dsv4_chat_session_position(s);
    int32_t *c = malloc(sizeof *c * (size_t)(*n + 1));
    if (*n) memcpy(c, dsv4_chat_session_tokens(s), sizeof *c * (size_t)*n);
    return c;
}

static void expect_prefix(dsv4_chat_session *s, const int32_t *old, int64_t n) {
    assert_true(dsv4_chat_session_position(s) >= n);
    if (n) assert_memory_equal(dsv4_chat_session_tokens(s), old, sizeof *old * (size_t)n);
}

static void chat_mode_turns(void **state) {
    fixture *f = *state;
    dsv4_chat_session *s = session(f, "Be brief.", 0);
    const char *q[] = { "hello", "abc abc", "aaaa bc" }, *a[] = { "hi there", "cab", "done." };
    for (int k = 0; k < 3; k++) {
        int64_t n_old;
        int32_t *old = snapshot_tokens(s, &n_old);
        user(s, q[k]);
        expect_full_render(f, s);          /* ends with <｜Assistant｜></think> */
        scripted_reply(f, s, a[k]);
        close_turn(s);
        expect_full_render(f, s);          /* ends with the reply + EOS */
        expect_prefix(s, old, n_old);
        free(old);
    }
    char *text;
    size_t len;
    dsv4_error err;
    assert_int_equal(dsv4_chat_session_render_full(s, &text, &len, &err), 0);
    assert_string_equal(text, BOS "Be brief." USER "hello" ASSIST "</think>hi there" EOS USER "abc abc" ASSIST
                              "</think>cab" EOS USER "aaaa bc" ASSIST "</think>done." EOS);
    free(text);
    dsv4_chat_session_free(s);
}

/* Thinking mode keeps earlier reasoning (drop_thinking = false): the official default would drop it and
 * change tokens already in the sequence. */
static void thinking_turns_keep_reasoning(void **state) {
    fixture *f = *state;
    dsv4_chat_session *s = session(f, NULL, 1);
    user(s, "One");
    scripted_reply(f, s, "think a</think>First.");
    close_turn(s);
    expect_full_render(f, s);
    user(s, "Two");
    expect_full_render(f, s);
    scripted_reply(f, s, "think b</think>Second.");
    close_turn(s);
    expect_full_render(f, s);
    char *text;
    size_t len;
    dsv4_error err;
    assert_int_equal(dsv4_chat_session_render_full(s, &text, &len, &err), 0);
    assert_string_equal(text, BOS USER "One" ASSIST "<think>think a</think>First." EOS USER "Two" ASSIST
                              "<think>think b</think>Second." EOS);
    free(text);
    const json_t *msgs = dsv4_chat_session_messages(s);
    assert_int_equal(json_array_size(msgs), 4);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "reasoning_content")), "think a");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "content")), "First.");
    dsv4_chat_session_free(s);
}

/* An interrupted thinking reply (still inside its reasoning) is closed with </think> + EOS; an interrupted chat
 * reply with EOS; an empty one too. Every state stays equal to its full rendering and later turns extend it. */
static void interrupted_replies(void **state) {
    fixture *f = *state;
    dsv4_chat_session *s = session(f, "S", 1);
    user(s, "Q1");
    scripted_reply(f, s, "partial reas");
    int64_t before = dsv4_chat_session_position(s);
    close_turn(s);
    assert_int_equal(dsv4_chat_session_position(s), before + 2);   /* </think>, EOS */
    expect_full_render(f, s);
    const json_t *a = json_array_get(dsv4_chat_session_messages(s), 2);
    assert_string_equal(json_string_value(json_object_get(a, "reasoning_content")), "partial reas");
    assert_string_equal(json_string_value(json_object_get(a, "content")), "");

    user(s, "Q2");                                                   /* interrupted before any token */
    before = dsv4_chat_session_position(s);
    close_turn(s);
    assert_int_equal(dsv4_chat_session_position(s), before + 2);
    expect_full_render(f, s);

    dsv4_chat_session_set_thinking(s, 0);
    user(s, "Q3");
    scripted_reply(f, s, "half an ans");
    before = dsv4_chat_session_position(s);
    close_turn(s);
    assert_int_equal(dsv4_chat_session_position(s), before + 1);   /* EOS only */
    /* Modes were mixed: the official encoder has one mode per conversation, so the check is on what was fed,
     * each turn as rendered in its own mode. */
    char *text;
    size_t len;
    dsv4_error err;
    assert_int_equal(dsv4_tokenizer_decode(f->tok, dsv4_chat_session_tokens(s), (size_t)dsv4_chat_session_position(s),
                                           &text, &len, &err), 0);
    assert_string_equal(text, BOS "S" USER "Q1" ASSIST "<think>partial reas</think>" EOS USER "Q2" ASSIST
                              "<think></think>" EOS USER "Q3" ASSIST "</think>half an ans" EOS);
    free(text);
    dsv4_chat_session_free(s);
}

/* Sampled replies: position bookkeeping and prefix stability; the same seed gives the same tokens. */
static int64_t sampled_conversation(fixture *f, int32_t *out, int cap) {
    dsv4_chat_session_opts o = { .system = "S", .thinking = 0, .sampling = { .temperature = 0.9f, .top_p = 1.0f, .seed = 5 } };
    dsv4_chat_session *s = NULL;
    dsv4_error err;
    assert_int_equal(dsv4_chat_session_new(f->m, f->tok, &o, &s, &err), 0);
    const char *q[] = { "abc", "bc bc" };
    for (int k = 0; k < 2; k++) {
        int64_t n_old;
        int32_t *old = snapshot_tokens(s, &n_old);
        user(s, q[k]);
        int64_t start = dsv4_chat_session_position(s);
        int done = 0, n = 0;
        int32_t tok;
        while (!done && n < 6) {
            assert_int_equal(dsv4_chat_session_next(s, &tok, &done, &err), 0);
            if (!done) { n++; assert_true(tok >= 0 && tok < dsv4_tokenizer_vocab_size(f->tok)); }
        }
        assert_int_equal(dsv4_chat_session_reply_len(s), n);
        assert_int_equal(dsv4_chat_session_position(s), start + n);
        int64_t pos_reply_end = dsv4_chat_session_position(s);
        close_turn(s);
        const int32_t *t = dsv4_chat_session_tokens(s);
        assert_int_equal(t[dsv4_chat_session_position(s) - 1], dsv4_tokenizer_eos_id(f->tok));
        assert_true(dsv4_chat_session_position(s) >= pos_reply_end + 1);
        expect_prefix(s, old, n_old);
        free(old);
    }
    int64_t n = dsv4_chat_session_position(s);
    assert_true(n <= cap);
    memcpy(out, dsv4_chat_session_tokens(s), sizeof *out * (size_t)n);
    /* /reset: a fresh sequence and conversation; the next turn starts again with BOS */
    assert_int_equal(dsv4_chat_session_reset(s, &err), 0);
    assert_int_equal(dsv4_chat_session_position(s), 0);
    user(s, "abc");
    assert_int_equal(dsv4_chat_session_tokens(s)[0], dsv4_tokenizer_bos_id(f->tok));
    expect_full_render(f, s);
    dsv4_chat_session_free(s);
    return n;
}

static void sampled_turns_deterministic(void **state) {
    fixture *f = *state;
    int32_t a[512], b[512];
    int64_t na = sampled_conversation(f, a, 512), nb = sampled_conversation(f, b, 512);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof *a * (size_t)na);
}

static void protocol_errors(void **state) {
    fixture *f = *state;
    dsv4_chat_session *s = session(f, NULL, 0);
    dsv4_error err;
    int32_t tok;
    int done;
    assert_int_equal(dsv4_chat_session_next(s, &tok, &done, &err), DSV4_E_STATE);
    assert_int_equal(dsv4_chat_session_close(s, &err), DSV4_E_STATE);
    user(s, "x");
    assert_int_equal(dsv4_chat_session_user(s, "y", &err), DSV4_E_STATE);
    int32_t eos = dsv4_tokenizer_eos_id(f->tok);
    assert_int_equal(dsv4_chat_session_feed_reply(s, &eos, 1, &err), DSV4_E_ARG);
    close_turn(s);
    expect_full_render(f, s);
    dsv4_chat_session_free(s);
    /* a tokenizer without the chat markers cannot run a V4 chat */
    dsv4_chat_session_opts o = { .sampling = { .top_p = 1.0f } };
    assert_int_equal(dsv4_chat_session_new(f->m, f->plain_tok, &o, &s, &err), DSV4_E_ARG);
    assert_non_null(strstr(err.msg, "tokenizer"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chat_mode_turns),
        cmocka_unit_test(thinking_turns_keep_reasoning),
        cmocka_unit_test(interrupted_replies),
        cmocka_unit_test(sampled_turns_deterministic),
        cmocka_unit_test(protocol_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
