#include "core/profile.h"
#include <time.h>

double cpu_profile_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void cpu_profile_report(const cpu_profile *p, FILE *f) {
    static const char *const names[CP_COUNT] = { "embed", "mHC + norms", "q/kv projections", "compressors", "indexer",
                                                 "attention", "output projection", "router", "routed + shared experts",
                                                 "head (and sampling)" };
    if (p->steps) profile_stage_table(f, "CPU, wall clock", names, p->ms, CP_COUNT, p->steps);
}

void profile_stage_table(FILE *f, const char *how, const char *const *names, const double *ms, int n, long steps) {
    double total = 0;
    for (int i = 0; i < n; i++) total += ms[i];
    fprintf(f, "per-stage time over %ld steps (%s):\n", steps, how);
    for (int i = 0; i < n; i++)
        fprintf(f, "  %-36s %9.3f ms/step %5.1f %%\n", names[i], ms[i] / (double)steps, total ? 100 * ms[i] / total : 0);
}
