/* The DSpark drafter's whole draft on the GPU (issue 11: the Markov and confidence heads on the device too): the
 * block, the Markov correction by the previous draft (read on the device), the draw and the confidence head, with
 * only the drafts, their confidence logits and, where asked, the distributions and corrected rows coming back.
 *   - On the GPU, draft j is exactly the host sampler's draw (draw number draw0 + j) from the GPU's corrected row
 *     j, and the GPU's distribution is sample_distribution of that row, bit for bit; a second run and a context
 *     committed in chunks give the same bits.
 *   - Against the CPU (the same committed features on both): the corrected rows and the confidence logits within
 *     1e-5 relative in EXACT mode, for every row whose previous draft agrees (a row's Markov input is the
 *     previous draft); OFFICIAL mode is printed.
 * Greedy and sampled (top-k, top-p, min-p), in both numeric modes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/dspark.h"
#include "core/sample.h"
#include "helpers/testmodel.h"
#include "model/tiny.h"

#define GPU_CPU_REL 1e-5

static double rel_row(const float *a, const float *b, int n) {
    double dmax = 0, bmax = 0;
    for (int i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= dmax)) dmax = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > bmax) bmax = fabs(b[i]);
    }
    return bmax > 0 ? dmax / bmax : dmax;
}

typedef struct {
    int32_t draft[64];
    float conf[64];
    float *probs, *U;   /* [g][V] */
} draft_out;

/* A context of the first n tokens' features (committed in chunks of `chunk`), then a draft of k rows. */
static void draft_on(dsv4_model *m, const float *feat, int n, int chunk, int32_t anchor, int k, const dsv4_sampling *sp,
                     uint64_t draw0, draft_out *o) {
    dsv4_error err;
    dsv4_dspark_ctx *c;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    const int fd = 3 * info.dim;   /* the tiny DSpark preset's three target layers */
    if (dsv4_dspark_ctx_new(m, &c, &err)) fail_msg("%s", err.msg);
    for (int done = 0; done < n; done += chunk)
        if (dsv4_dspark_commit(m, c, feat + (int64_t)done * fd, n - done < chunk ? n - done : chunk, &err)) fail_msg("commit: %s", err.msg);
    if (dsv4_dspark_draft(m, c, anchor, k, sp, draw0, o->draft, o->conf, sp->temperature > 0 ? o->probs : NULL, o->U, &err))
        fail_msg("draft: %s", err.msg);
    dsv4_dspark_ctx_free(c);
}

static void whole_draft_on_the_gpu(void **state) {
    (void)state;
    char tmpl[] = "/tmp/dsv4-test-XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    const char *sets[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"};
    dsv4_tiny_opts o = { .preset = "flash-tiny", .seed = 6, .sets = sets, .n_sets = 3, .mtp = MTP_DSPARK };
    dsv4_error err;
    if (dsv4_tiny_write(tmpl, &o, &err)) fail_msg("%s", err.msg);
    const dsv4_sampling sps[] = {
        { .temperature = 0.0f, .top_p = 1.0f, .seed = 1 },
        { .temperature = 0.8f, .top_k = 20, .top_p = 1.0f, .seed = 2 },
        { .temperature = 1.0f, .top_p = 0.9f, .min_p = 0.02f, .seed = 3 },
        { .temperature = 1.3f, .top_p = 1.0f, .seed = 4 },
    };
    for (int official = 0; official < 2; official++) {
        const dsv4_mode mode = official ? DSV4_MODE_OFFICIAL : DSV4_MODE_EXACT;
        dsv4_model *cpu = tm_load(tmpl, mode, DSV4_DEVICE_CPU, DSV4_KV_F32), *gpu = tm_load(tmpl, mode, DSV4_DEVICE_CUDA, DSV4_KV_F32);
        assert_non_null(cpu);
        assert_non_null(gpu);
        dsv4_model_info info;
        dsv4_model_get_info(cpu, &info);
        const int V = info.vocab_size, g = dsv4_dspark_block_size(cpu), n = 40;
        if (dsv4_dspark_rank(cpu) <= 0 || g <= 0 || g > 64) fail_msg("not a DSpark checkpoint (block %d)", g);
        int32_t tok[40];
        tm_tokens(tok, n, V, 29);
        /* the target's features, from the CPU model, committed to both drafters */
        float *feat = malloc(sizeof(float) * (size_t)n * 3 * info.dim);
        dsv4_seq *t;
        assert_int_equal(dsv4_seq_new(cpu, &t, &err), 0);
        dsv4_step_item it = { t, tok, n, DSV4_LOGITS_NONE, NULL, NULL, feat };
        assert_int_equal(dsv4_step(cpu, &it, 1, &err), 0);
        dsv4_seq_free(t);
        sample_scratch sc;
        assert_int_equal(sample_scratch_init(&sc, V), 0);
        float *want_p = malloc(sizeof(float) * (size_t)V);
        draft_out a, b, c;
        draft_out *outs[3] = { &a, &b, &c };
        for (int i = 0; i < 3; i++) {
            outs[i]->probs = malloc(sizeof(float) * (size_t)g * V);
            outs[i]->U = malloc(sizeof(float) * (size_t)g * V);
        }
        for (size_t si = 0; si < sizeof sps / sizeof sps[0]; si++) {
            const dsv4_sampling *sp = &sps[si];
            const uint64_t draw0 = 11 + si;
            draft_on(gpu, feat, n, n, tok[n - 1], g, sp, draw0, &a);
            draft_on(gpu, feat, n, 7, tok[n - 1], g, sp, draw0, &b);
            if (memcmp(a.draft, b.draft, sizeof(int32_t) * (size_t)g) || memcmp(a.conf, b.conf, sizeof(float) * (size_t)g) ||
                memcmp(a.U, b.U, sizeof(float) * (size_t)g * V))
                fail_msg("%s set %zu: the GPU draft differs with the context committed in chunks / on a second run",
                         official ? "OFFICIAL" : "EXACT", si);
            for (int j = 0; j < g; j++) {
                const int32_t host = sample_row(sp, draw0 + (uint64_t)j, a.U + (int64_t)j * V, &sc);
                if (host != a.draft[j])
                    fail_msg("%s set %zu row %d: GPU draft %d, the host's draw from the GPU's row %d", official ? "OFFICIAL" : "EXACT",
                             si, j, a.draft[j], host);
                if (sp->temperature > 0) {
                    sample_distribution(sp, a.U + (int64_t)j * V, &sc, want_p);
                    if (memcmp(want_p, a.probs + (int64_t)j * V, sizeof(float) * (size_t)V))
                        fail_msg("set %zu row %d: the GPU's drafting distribution differs from the host's", si, j);
                }
            }
            draft_on(cpu, feat, n, n, tok[n - 1], g, sp, draw0, &c);
            double eu = 0, ez = 0;
            int rows = 0, same = 0;
            for (int j = 0; j < g; j++) {
                if (j > 0 && a.draft[j - 1] != c.draft[j - 1]) break;   /* other Markov input from here on */
                const double u = rel_row(a.U + (int64_t)j * V, c.U + (int64_t)j * V, V);
                const double z = fabs((double)a.conf[j] - c.conf[j]) / fmax(1.0, fabs((double)c.conf[j]));
                if (!(u <= eu)) eu = u;
                if (!(z <= ez)) ez = z;
                rows++;
                same += a.draft[j] == c.draft[j];
            }
            printf("  DSpark %-8s T %.1f top-k %2d top-p %.2f min-p %.2f: GPU vs CPU over %d comparable rows: corrected logits %.3g, "
                   "confidence %.3g; %d/%d drafts equal\n", official ? "OFFICIAL" : "EXACT", (double)sp->temperature, sp->top_k,
                   (double)sp->top_p, (double)sp->min_p, rows, eu, ez, same, rows);
            if (!official && !(eu <= GPU_CPU_REL && ez <= GPU_CPU_REL))
                fail_msg("DSpark EXACT GPU vs CPU: corrected logits %.3g, confidence %.3g", eu, ez);
        }
        for (int i = 0; i < 3; i++) {
            free(outs[i]->probs);
            free(outs[i]->U);
        }
        free(want_p);
        free(feat);
        sample_scratch_free(&sc);
        dsv4_model_free(gpu);
        dsv4_model_free(cpu);
    }
    tm_rmdir(tmpl);
}

int main(void) {
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu dspark: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(whole_draft_on_the_gpu),
    };
    return cmocka_run_group_tests_name("the DSpark draft on the GPU vs the CPU", tests, NULL, NULL);
}
