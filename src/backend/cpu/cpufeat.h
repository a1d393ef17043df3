/* Run-time CPU feature detection (one answer per process). */
#ifndef DSV4_CPU_CPUFEAT_H
#define DSV4_CPU_CPUFEAT_H
#include <stdint.h>

enum {
    CPU_AVX2        = 1u << 0,   /* AVX2 + FMA + F16C, ymm state enabled by the OS */
    CPU_AVX512      = 1u << 1,   /* AVX-512 F/BW/DQ/VL, zmm state enabled */
    CPU_AVX512_BF16 = 1u << 2,
    CPU_AMX_BF16    = 1u << 3,   /* AMX-TILE + AMX-BF16, and the kernel granted the tile state */
};

/* The CPU_* bits usable here (the first call asks the CPU and, for AMX, the kernel). */
unsigned cpu_features(void);
#endif
