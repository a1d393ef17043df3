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
    if (!p->steps) return;
    double total = 0;
    for (int i = 0; i < CP_COUNT; i++) total += p->ms[i];
    fprintf(f, "per-stage time over %ld steps (CPU, wall clock):\n", p->steps);
    for (int i = 0; i < CP_COUNT; i++)
        fprintf(f, "  %-36s %9.3f ms/step %5.1f %%\n", names[i], p->ms[i] / (double)p->steps, total ? 100 * p->ms[i] / total : 0);
}
