/* Where a CPU step's time goes (dsv4 bench --profile): with a model's profile on, every stage boundary of the
 * forward adds the wall time since the previous boundary to the stage that just ended; off, a boundary is one
 * branch. The stages are the CUDA profile's (backend/cuda/cuda_step.c), except that the shared expert runs in the
 * routed experts' pool dispatch (core/moe.c) and is counted with them. Timing changes no value. */
#ifndef DSV4_CORE_PROFILE_H
#define DSV4_CORE_PROFILE_H
#include <stdio.h>

enum { CP_EMBED, CP_MHC, CP_QKV, CP_COMPRESS, CP_INDEX, CP_ATTEND, CP_OUTPUT, CP_ROUTE, CP_EXPERTS, CP_HEAD, CP_COUNT };

typedef struct {
    int on;
    double t_last;            /* ms, monotonic clock, at the last boundary */
    double ms[CP_COUNT];
    long steps;
} cpu_profile;

double cpu_profile_now_ms(void);
/* The end of stage `stage` (CP_*). */
static inline void cpu_profile_mark(cpu_profile *p, int stage) {
    if (!p->on) return;
    const double t = cpu_profile_now_ms();
    p->ms[stage] += t - p->t_last;
    p->t_last = t;
}
/* A step begins: the clock restarts, so time between steps (the caller's) is charged to no stage. */
static inline void cpu_profile_step(cpu_profile *p) {
    if (!p->on) return;
    p->t_last = cpu_profile_now_ms();
    p->steps++;
}
/* Totals per step and shares; nothing when no step ran. */
void cpu_profile_report(const cpu_profile *p, FILE *f);
/* The table both profiles print: "per-stage time over S steps (how):", then each of the n stages' ms per step and
 * share of the total. */
void profile_stage_table(FILE *f, const char *how, const char *const *names, const double *ms, int n, long steps);
#endif
