/* Measure the CPU's arithmetic ceiling: every thread of the pool runs its kernel set's multiply-add on registers
 * (isa.h peak_flops) at once. The number `dsv4 bench` holds the linears' counted work against, as it holds their
 * bytes against cpu_read_bandwidth_gbs (membw.h): a step can be bound by either. */
#ifndef DSV4_CPU_PEAK_H
#define DSV4_CPU_PEAK_H
#include "backend/cpu/pool.h"

/* Best of `repeats` runs of ~50 ms, in GFLOP/s (1e9 flops); bf16: VDPBF16PS where the pool's set has it (the pair
 * order's instruction), else the set's fp32 FMA. Negative when out of memory. */
double cpu_peak_gflops(dsv4_pool *pool, int bf16, int repeats);
#endif
