/* See reply_grammar.h. */
#include "engine/reply_grammar.h"
#include "text/chat.h"
#include "util/error.h"
#include <string.h>

int32_t dsv4_reasoning_rule(gb_builder *b) {
    static const char rest[] = "/think>";      /* "</think>" after its '<' */
    const size_t n = sizeof rest - 1;
    const gb_range lt = { '<', '<' };
    const int32_t run = gb_repeat(b, gb_class(b, &lt, 1, 1), 0, -1);   /* [^<]* */
    /* W, from the inside out: level i has matched rest[0..i); it may end, leave the marker with any character
     * but '<' and rest[i] (then any run), or go on with rest[i] — except at the last level, where rest[i]
     * would complete "</think>" */
    int32_t inner = -1;
    gb_seq q;
    gb_seq_init(&q);
    for (size_t i = n; i-- > 0;) {
        const int32_t level = gb_rule(b, NULL);
        gb_seq_clear(&q);
        gb_add_alt(b, level, &q);                                         /* ends here */
        const gb_range not2[] = { { '<', '<' }, { (unsigned char)rest[i], (unsigned char)rest[i] } };
        gb_seq_ref(&q, gb_class(b, not2, 2, 1));
        gb_seq_ref(&q, run);
        gb_add_alt(b, level, &q);                                         /* leaves the marker */
        if (inner >= 0) {
            gb_seq_clear(&q);
            gb_seq_byte(&q, b, (unsigned char)rest[i]);
            gb_seq_ref(&q, inner);
            gb_add_alt(b, level, &q);                                     /* follows it */
        }
        inner = level;
    }
    /* reasoning ::= run ("<" W)* */
    gb_seq_clear(&q);
    gb_seq_byte(&q, b, '<');
    gb_seq_ref(&q, inner);
    const int32_t segment = gb_rule_of(b, &q);
    gb_seq_clear(&q);
    gb_seq_ref(&q, run);
    gb_seq_ref(&q, gb_repeat(b, segment, 0, -1));
    const int32_t r = gb_rule(b, "reasoning");
    gb_add_alt(b, r, &q);
    gb_seq_free(&q);
    return gb_oom(b) ? -1 : r;
}

int dsv4_grammar_json_reply(const json_t *schema, const dsv4_schema_opts *o, int thinking, dsv4_grammar **out,
                            dsv4_error *err) {
    *out = NULL;
    if (!thinking) return schema ? dsv4_grammar_from_schema(schema, o, out, err) : dsv4_grammar_json_any(o, out, err);
    gb_builder *b = gb_new();
    if (!b) return dsv4_fail(err, DSV4_E_NOMEM, "json reply: out of memory");
    const int32_t answer = dsv4_schema_rule(b, schema, schema, o, NULL, err);
    if (answer < 0) { gb_free(b); return err && err->code ? err->code : DSV4_E_ARG; }
    const int32_t reasoning = dsv4_reasoning_rule(b);
    if (reasoning < 0) { gb_free(b); return dsv4_fail(err, DSV4_E_NOMEM, "json reply: out of memory"); }
    gb_seq q;
    gb_seq_init(&q);
    gb_seq_ref(&q, reasoning);
    gb_seq_special(&q, b, DSV4_THINK_END_TEXT);
    gb_seq_ref(&q, answer);
    const int32_t root = gb_rule(b, "reply");
    gb_add_alt(b, root, &q);
    gb_seq_free(&q);
    return gb_finish(b, root, out, err);
}
