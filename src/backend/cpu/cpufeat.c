/* Which instruction sets this CPU and its OS let us use, asked once at run time (cpuid, xgetbv, and for AMX
 * the kernel's permission for the tile state). Compiled with the build's baseline flags only: nothing here may
 * use an instruction that the answer is about. */
#include "backend/cpu/cpufeat.h"
#include <pthread.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static unsigned detect(void) {
    unsigned f = 0, a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave) return 0;
    const uint64_t xcr0 = xgetbv0();
    const int os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = (xcr0 & 0xe6) == 0xe6, os_tile = (xcr0 & 0x60000) == 0x60000;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned b7 = b, d7 = d;
    __cpuid_count(7, 1, a, b, c, d);
    const unsigned a71 = a;
    if (os_ymm && fma && f16c && ((b7 >> 5) & 1)) f |= CPU_AVX2;
    if ((f & CPU_AVX2) && os_zmm && ((b7 >> 16) & 1) && ((b7 >> 30) & 1) && ((b7 >> 17) & 1) && ((b7 >> 31) & 1))
        f |= CPU_AVX512;
    if ((f & CPU_AVX512) && ((a71 >> 5) & 1)) f |= CPU_AVX512_BF16;
    /* AMX-BF16 (bit 22) and AMX-TILE (bit 24), the OS saving the tile state, and Linux's per-process
     * permission to use it (refused on kernels before 5.16) */
    if ((f & CPU_AVX512_BF16) && ((d7 >> 22) & 1) && ((d7 >> 24) & 1) && os_tile &&
        syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
        f |= CPU_AMX_BF16;
    return f;
}
#else
static unsigned detect(void) { return 0; }
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static unsigned features;
static void init(void) { features = detect(); }

unsigned cpu_features(void) {
    pthread_once(&once, init);
    return features;
}
