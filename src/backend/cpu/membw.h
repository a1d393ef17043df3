/* Measure the machine's memory read bandwidth: every thread of the pool sums its share of a buffer much
 * larger than the caches. The number `dsv4 bench` reports decode speed against. */
#ifndef DSV4_CPU_MEMBW_H
#define DSV4_CPU_MEMBW_H
#include "backend/cpu/pool.h"
#include <stddef.h>

/* Best of `repeats` passes over `bytes` bytes, in GB/s (1e9 bytes). Negative if the buffer cannot be had. */
double cpu_read_bandwidth_gbs(dsv4_pool *pool, size_t bytes, int repeats);
#endif
