/* Choosing a kernel set (isa.h), and the entry points that do not depend on it. */
#include "backend/cpu/isa.h"
#include "backend/cpu/cpufeat.h"
#include "backend/cpu/kernels.h"
#include "model/formats.h"
#include "util/error.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

extern const cpu_kernels cpu_kernels_scalar;
#if defined(__x86_64__)   /* the Makefile builds these on x86-64 only */
extern const cpu_kernels cpu_kernels_avx2, cpu_kernels_avx512, cpu_kernels_avx512bf16;
int pairs_selftest_avx512bf16(void);
#endif

typedef struct {
    const cpu_kernels *k;
    unsigned needs;   /* CPU_* bits */
    int (*check)(void);   /* NULL, or a start-up check the CPU must also pass (once per process) */
} isa_entry;

#if defined(__x86_64__)
/* VDPBF16PS computes the pair order's steps here (isa/pairs.c's pairs_selftest; asked once, and only after
 * cpu_features() found AVX512-BF16). */
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static int bf16_ok;
static void bf16_test(void) { bf16_ok = pairs_selftest_avx512bf16(); }
static int bf16_check(void) {
    pthread_once(&bf16_once, bf16_test);
    return bf16_ok;
}
#endif

/* best first */
static const isa_entry sets[] = {
#if defined(__x86_64__)
    { &cpu_kernels_avx512bf16, CPU_AVX2 | CPU_AVX512 | CPU_AVX512_BF16, bf16_check },
    { &cpu_kernels_avx512, CPU_AVX2 | CPU_AVX512, NULL },
    { &cpu_kernels_avx2, CPU_AVX2, NULL },
#endif
    { &cpu_kernels_scalar, 0, NULL },
};
enum { N_SETS = sizeof sets / sizeof sets[0] };

static const isa_entry *find(const char *name) {
    for (int i = 0; i < N_SETS; i++)
        if (!strcmp(sets[i].k->name, name)) return &sets[i];
    return NULL;
}

static int runs_here(const isa_entry *e) { return (cpu_features() & e->needs) == e->needs && (!e->check || e->check()); }

const cpu_kernels *cpu_kernels_best(void) {
    for (int i = 0; i < N_SETS; i++)
        if (runs_here(&sets[i])) return sets[i].k;
    return &cpu_kernels_scalar;   /* not reached: scalar needs nothing */
}

int cpu_kernels_runnable(const char *name) {
    const isa_entry *e = find(name);
    return e && runs_here(e);
}

const char *cpu_kernels_built(void) {
#if defined(__x86_64__)
    return "avx512bf16 avx512 avx2 scalar";
#else
    return "scalar";
#endif
}

int cpu_kernels_pick(const char *name, const cpu_kernels **out, dsv4_error *err) {
    const char *from = "cpu_isa";
    if (!name || !*name || !strcmp(name, "auto")) {
        name = getenv("DSV4_ISA");
        from = "DSV4_ISA";
        if (!name || !*name || !strcmp(name, "auto")) {
            *out = cpu_kernels_best();
            return 0;
        }
    }
    const isa_entry *e = find(name);
    if (!e) return dsv4_fail(err, DSV4_E_ARG, "%s: unknown instruction set '%s' (this build has: %s, or auto)", from, name,
                             cpu_kernels_built());
    if (!runs_here(e)) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: this CPU cannot run the %s kernels", from, name);
    *out = e->k;
    return 0;
}

/* Row decoding and the element-wise OFFICIAL roundings give exactly defined values whatever the instruction set,
 * so the callers outside a linear (embedding lookups, activation quantization) take the best set without asking a
 * pool. */
void weight_decode_row(const dsv4_weight *w, int row, float *out) { cpu_kernels_best()->decode_row(w, row, out); }

float weight_dot_row(const dsv4_weight *w, int row, const float *x, float *scratch) {
    return cpu_kernels_best()->dot_row(w, row, x, scratch);
}

void act_quant_fp8_inplace(float *x, int n, int block) { cpu_kernels_best()->act_quant_fp8(x, n, block); }

void round_bf16_array(float *x, long n) { cpu_kernels_best()->round_bf16(x, n); }
