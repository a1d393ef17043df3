/* dsv4 bench --grammar: see constraint_bench.h. */
#include "engine/constraint_bench.h"
#include "engine/bench_streams.h"
#include "engine/constraint.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Mask times are CPU time of this thread: on a shared machine wall time would measure the neighbours. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const char *name;
    const char *schema;      /* JSON Schema, "" = JSON mode; NULL: grammar below */
    const char *grammar;
    const char *document;    /* a valid output, replayed */
} bench_case;

static const bench_case CASES[] = {
    {"person (object)",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
     "\"email\":{\"type\":\"string\",\"pattern\":\"^[a-z0-9._]+@[a-z0-9]+\\\\.[a-z]{2,4}$\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
     "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"maxLength\":10}},"
     "\"required\":[\"city\"]}},\"required\":[\"name\",\"age\"]}",
     NULL,
     "{\"name\": \"Ada Lovelace, Countess of Lovelace, who wrote the first published algorithm for a machine\", \"age\": 36, "
     "\"email\": \"ada.lovelace@example.org\", \"tags\": [\"mathematics\", \"analytical engine\", \"poetical science\", \"notes\"], "
     "\"address\": {\"street\": \"St James's Square 12\", \"city\": \"London\", \"zip\": \"SW1Y 4JH\"}}"},
    {"tool call ($defs, enum, anyOf)",
     "{\"$defs\":{\"arg\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"number\"},{\"type\":\"boolean\"}]}},\"type\":\"object\","
     "\"properties\":{\"tool\":{\"enum\":[\"search\",\"read_url\",\"calculator\",\"python\"]},\"arguments\":{\"type\":\"object\","
     "\"additionalProperties\":{\"$ref\":\"#/$defs/arg\"}},\"reason\":{\"type\":\"string\",\"maxLength\":200}},\"required\":[\"tool\",\"arguments\"]}",
     NULL,
     "{\"tool\": \"search\", \"arguments\": {\"query\": \"DeepSeek V4 structured output JSON schema\", \"top_k\": 5, \"fresh\": true}, "
     "\"reason\": \"The user asked for recent documentation; a web search finds it fastest.\"}"},
    {"JSON mode (any value)", "", NULL,
     "{\"results\": [{\"id\": 1, \"score\": 0.93, \"title\": \"Structured decoding with pushdown automata\"}, {\"id\": 2, "
     "\"score\": 0.71, \"title\": \"Token masks on a 128K vocabulary\"}], \"next\": null, \"total\": 2}"},
    {"grammar (GBNF)", NULL,
     "root ::= \"Answer: \" verdict \". Because \" reason \".\"\nverdict ::= \"yes\" | \"no\"\nreason ::= [a-zA-Z ,']{1,300}\n",
     "Answer: yes. Because the schema compiler turns every keyword into grammar rules and the matcher walks the vocabulary trie once."},
};

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void report(FILE *out, const char *what, double *t, int n, const dsv4_cstate *s) {
    if (n == 0) { fprintf(out, "    %-7s no tokens\n", what); return; }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double sum = 0;
    int slow = 0;
    for (int i = 0; i < n; i++) { sum += t[i]; slow += t[i] > 1e-3; }
    dsv4_cstate_stats st;
    dsv4_cstate_get_stats(s, &st);
    fprintf(out, "    %-7s %4d tokens: mask (CPU time) median %8.1f us, p99 %8.1f us, max %8.1f us, mean %8.1f us, %d over 1 ms  "
                 "(%lld trie walks, %lld of them shared, %lld closed forms, %lld cached, %lld configurations, %lld transitions, %lld trie nodes visited)\n",
            what, n, t[n / 2] * 1e6, t[(int)((n - 1) * 0.99)] * 1e6, t[n - 1] * 1e6, sum / n * 1e6, slow,
            (long long)st.mask_walks, (long long)st.shared_walks, (long long)st.count_forms, (long long)st.mask_hits, (long long)st.configs, (long long)st.transitions,
            (long long)st.trie_nodes_visited);
}

int dsv4_constraint_bench(const dsv4_tokenizer *tok, FILE *out, dsv4_error *err) {
    const int32_t V = dsv4_tokenizer_vocab_size(tok), eos = dsv4_tokenizer_eos_id(tok);
    if (eos < 0) return dsv4_fail(err, DSV4_E_ARG, "bench --grammar: the tokenizer names no end-of-sequence token");
    double t0 = now_s();
    dsv4_cvocab *v;
    int rc = dsv4_cvocab_from_tokenizer(tok, V, eos, &v, err);
    if (rc) return rc;
    fprintf(out, "vocabulary: %d tokens, trie built in %.1f ms\n", V, (now_s() - t0) * 1e3);
    float *logits = malloc(sizeof *logits * (size_t)V);
    uint64_t *bits = malloc(sizeof *bits * (size_t)((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V);
    double *times = malloc(sizeof *times * 4096);
    if (!logits || !bits || !allowed || !times) { rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); goto out; }
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0] && !rc; c++) {
        const bench_case *bc = &CASES[c];
        dsv4_grammar *g = NULL;
        const dsv4_schema_opts so = { 2 };
        t0 = now_s();
        rc = bc->schema ? (bc->schema[0] ? dsv4_grammar_from_schema_text(bc->schema, strlen(bc->schema), &so, &g, err)
                                         : dsv4_grammar_json_any(&so, &g, err))
                        : dsv4_grammar_from_gbnf(bc->grammar, strlen(bc->grammar), &g, err);
        if (rc) break;
        fprintf(out, "%s: compiled in %.2f ms (%d rules)\n", bc->name, (now_s() - t0) * 1e3, g->n_rule);
        /* replay the document */
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if ((rc = dsv4_tokenizer_encode(tok, bc->document, strlen(bc->document), DSV4_ENCODE_PLAIN, &ids, &n_ids, err))) { dsv4_grammar_free(g); break; }
        /* a first request, then a second one with the same schema on the same matcher (a server's case) */
        dsv4_cmatcher *mt = NULL;
        if ((rc = dsv4_cmatcher_new(g, v, &mt, err))) { free(ids); dsv4_grammar_free(g); break; }
        dsv4_cstate *s = NULL;
        for (int pass = 0; pass < 2 && !rc; pass++) {
            if ((rc = dsv4_cstate_new_shared(mt, 4000, &s, err))) break;
            int n = 0;
            for (size_t i = 0; i <= n_ids && n < 4096; i++) {
                memset(logits, 0, sizeof *logits * (size_t)V);
                const double a = cpu_s();
                if ((rc = dsv4_cstate_mask(s, logits, err))) break;
                times[n++] = cpu_s() - a;
                const int32_t next = i < n_ids ? ids[i] : eos;
                if (logits[next] != 0.0f) { rc = dsv4_fail(err, DSV4_E_STATE, "bench: %s: token %zu of the document is masked", bc->name, i); break; }
                if ((rc = dsv4_cstate_advance(s, next, err))) break;
            }
            if (!rc) report(out, pass ? "again" : "replay", times, n, s);
            dsv4_cstate_free(s);
            s = NULL;
        }
        if (!rc) fprintf(out, "    matcher after both: %.1f MB\n", dsv4_cmatcher_bytes(mt) / 1e6);
        dsv4_cmatcher_free(mt);
        free(ids);
        /* uniform random among the allowed tokens, bounded to 1500 bytes */
        if (!rc && !(rc = dsv4_cstate_new(g, v, 1500, &s, err))) {
            uint64_t rng = 42 + c;
            int n = 0;
            while (!dsv4_cstate_finished(s) && n < 4096) {
                memset(logits, 0, sizeof *logits * (size_t)V);
                const double a = cpu_s();
                if ((rc = dsv4_cstate_mask(s, logits, err))) break;
                times[n++] = cpu_s() - a;
                int na = 0;
                for (int32_t id = 0; id < V; id++)
                    if (logits[id] == 0.0f) allowed[na++] = id;
                if (!na) { rc = dsv4_fail(err, DSV4_E_STATE, "bench: %s: nothing allowed", bc->name); break; }
                if ((rc = dsv4_cstate_advance(s, allowed[splitmix(&rng) % (uint64_t)na], err))) break;
            }
            if (!rc) report(out, "random", times, n, s);
            dsv4_cstate_free(s);
        }
        dsv4_grammar_free(g);
    }
out:
    free(logits);
    free(bits);
    free(allowed);
    free(times);
    dsv4_cvocab_free(v);
    return rc;
}

/* CPU time of the masks of `steps` decode steps of B streams on one matcher (each stream replays the document,
 * offset by its index so that the streams sit at different positions): seconds per step. */
static int masks_per_step(dsv4_cmatcher *mt, const int32_t *ids, int n_ids, int32_t eos, int B, int steps, float *logits,
                          int32_t V, double *per_step, dsv4_error *err) {
    dsv4_cstate **st = calloc((size_t)B, sizeof *st);
    int *at = calloc((size_t)B, sizeof *at);
    int rc = st && at ? 0 : dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    for (int b = 0; b < B && !rc; b++) {
        rc = dsv4_cstate_new_shared(mt, 100000, &st[b], err);
        for (int k = 0; !rc && k < b % (n_ids / 2 + 1); k++) rc = dsv4_cstate_advance(st[b], ids[at[b]++], err);
    }
    double t = 0;
    for (int step = 0; step < steps && !rc; step++)
        for (int b = 0; b < B && !rc; b++) {
            if (at[b] >= n_ids) { /* the document is done: start it again */
                dsv4_cstate_free(st[b]);
                at[b] = 0;
                if ((rc = dsv4_cstate_new_shared(mt, 100000, &st[b], err))) break;
            }
            const double a = cpu_s();
            rc = dsv4_cstate_mask(st[b], logits, err);
            t += cpu_s() - a;
            if (!rc) rc = dsv4_cstate_advance(st[b], ids[at[b]++], err);
        }
    for (int b = 0; b < B && st; b++) dsv4_cstate_free(st[b]);
    free(st);
    free(at);
    (void)eos; (void)V;
    *per_step = t / steps;
    return rc;
}

int dsv4_constraint_bench_overhead(dsv4_model *m, const dsv4_tokenizer *tok, FILE *out, dsv4_error *err) {
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    const int32_t V = info.vocab_size, eos = info.eos_id >= 0 ? info.eos_id : dsv4_tokenizer_eos_id(tok);
    dsv4_cvocab *v = NULL;
    int rc = dsv4_cvocab_from_tokenizer(tok, V, eos, &v, err);
    if (rc) return rc;
    dsv4_grammar *g = NULL;
    const dsv4_schema_opts so = { 2 };
    const char *doc = CASES[0].document;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = malloc(sizeof *logits * (size_t)V);
    if (!logits) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (!rc) rc = dsv4_grammar_from_schema_text(CASES[0].schema, strlen(CASES[0].schema), &so, &g, err);
    if (!rc) rc = dsv4_tokenizer_encode(tok, doc, strlen(doc), DSV4_ENCODE_PLAIN, &ids, &n_ids, err);
    fprintf(out, "overhead on a batched decode step (model vocabulary %d, schema \"%s\", masks in CPU time of one core, "
                 "steps in wall time):\n", V, CASES[0].name);
    static const int BS[] = { 1, 8, 32 };
    for (size_t k = 0; k < sizeof BS / sizeof *BS && !rc; k++) {
        const int B = BS[k], steps = 8;
        dsv4_bench_streams_result r;
        if ((rc = dsv4_bench_streams(m, B, 16, steps, &r, err))) break;
        dsv4_cmatcher *mt = NULL;
        double cold = 0, warm = 0;
        if ((rc = dsv4_cmatcher_new(g, v, &mt, err))) break;
        rc = masks_per_step(mt, ids, (int)n_ids, eos, B, steps, logits, V, &cold, err);
        if (!rc) rc = masks_per_step(mt, ids, (int)n_ids, eos, B, steps, logits, V, &warm, err);
        dsv4_cmatcher_free(mt);
        if (rc) break;
        const double step_s = r.decode_s / steps;
        fprintf(out, "    B=%-3d decode step %9.3f ms; masks per step: first request %8.3f ms (%5.1f %%), warm %8.3f ms (%5.2f %%)\n",
                B, step_s * 1e3, cold * 1e3, 100 * cold / step_s, warm * 1e3, 100 * warm / step_s);
    }
    free(ids);
    free(logits);
    dsv4_grammar_free(g);
    dsv4_cvocab_free(v);
    return rc;
}
