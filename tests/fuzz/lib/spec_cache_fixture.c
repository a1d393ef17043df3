/* Prefix-cache files with a drafter's state beside them (state/prefix_companion.h), made the way the server makes
 * them: one speculating stream in the scheduler with a disk-backed prefix cache. Shared by the prefix_disk target
 * (its fixture) and tests/fuzz/tools/make_corpus.c (its seeds), so both describe the same files. */
#include "../fuzz.h"
#include "engine/drafter_named.h"
#include "engine/scheduler.h"
#include <stdio.h>
#include <stdlib.h>

void fuzz_spec_cache_fill(dsv4_model *m, const char *kind, const int32_t *prompt, int n, const char *dir) {
    dsv4_error err;
    dsv4_prefix_cache *pc;
    dsv4_sched *s;
    dsv4_sched_opts o = { 1, 0 };
    if (dsv4_prefix_cache_new(16 << 20, &pc, &err) || dsv4_prefix_cache_set_dir(pc, dir, 16 << 20, &err) ||
        dsv4_sched_new(m, &o, &s, &err)) {
        fprintf(stderr, "fuzz: spec cache fixture: %s\n", err.msg);
        abort();
    }
    dsv4_sched_set_prefix_cache(s, pc);
    dsv4_request r = { .prompt = prompt, .n_prompt = n, .max_new_tokens = 1,
                       .sampling = { .temperature = 0.0f, .top_p = 1.0f, .seed = 1 } };
    r.spec = (dsv4_sched_spec){ dsv4_drafter_named_make, (void *)kind, 1, 0.0f };
    int64_t id;
    if (dsv4_sched_add(s, &r, &id, &err)) { fprintf(stderr, "fuzz: spec cache fixture: %s\n", err.msg); abort(); }
    while (dsv4_sched_pending(s))
        if (dsv4_sched_step(s, &err)) { fprintf(stderr, "fuzz: spec cache fixture: %s\n", err.msg); abort(); }
    dsv4_req_result res;
    if (dsv4_sched_result(s, id, &res, &err) || res.finish == DSV4_FINISH_ERROR) {
        fprintf(stderr, "fuzz: spec cache fixture: the %s stream failed\n", kind);
        abort();
    }
    dsv4_sched_free(s);
    dsv4_prefix_cache_free(pc);
}
