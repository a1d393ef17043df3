/* The token split of experts in host memory (issue 15, `--bus-by-token`, docs/HOST_EXPERTS.md): which side computes
 * a (token, expert) pair of an EXPERT_ON_SPLIT expert — the host's cores, or the GPU reading the expert's weights
 * over the bus. Written once for both: the host's loops (core/moe.c moe_host_rows) and the GPU's plan
 * (backend/cuda/k_moe.cu k_moe_split_tiles) include this, so both sides take the same pairs.
 *
 * The rule: of a token's routes to a layer's split experts (h distinct experts), b = floor((h pct + 50) / 100) go
 * over the bus, those to the b highest expert ids; the others are the host's. It reads the token's own routing row
 * and nothing else, so a pair's row comes from the same kernel whatever the step's other tokens are: batch, chunk
 * and restore invariance hold as for a fixed placement.
 *
 * Why by token: at batch 1 a layer waits for the slower of its two sides, and a fixed share by expert id (the bus
 * experts of --bus-share) gives one token three host routes and no bus route, the next one a bus route and two
 * host routes at random: the sides balance only on average. Splitting each token's own routes puts about pct % of
 * every token's host bytes on the bus. */
#ifndef DSV4_MODEL_EXPERT_SPLIT_H
#define DSV4_MODEL_EXPERT_SPLIT_H
#include <stdint.h>

#ifndef DSV4_HOST_DEVICE
#ifdef __CUDACC__
#define DSV4_HOST_DEVICE __host__ __device__
#else
#define DSV4_HOST_DEVICE
#endif
#endif

/* An expert in host memory, its bytes page-locked and mapped, computed by either side as the rule picks per token
 * (expert_place.h's owner values are 0..2). */
#define EXPERT_ON_SPLIT 3

/* Whether expert e, routed by `row` (a token's K routing entries; e one of them), is computed over the bus. owner:
 * the layer's owner row [E]; pct: the share of a token's split routes the bus takes (percent, 0..100). */
static inline DSV4_HOST_DEVICE int expert_split_on_bus(const uint8_t *owner, const int32_t *row, int K, int e, int pct) {
    int h = 0, above = 0;   /* the row's distinct split experts, and those of them above e */
    for (int j = 0; j < K; j++) {
        const int x = row[j];
        int seen = owner[x] != EXPERT_ON_SPLIT;
        for (int q = 0; q < j && !seen; q++) seen = row[q] == x;
        if (seen) continue;
        h++;
        above += x > e;
    }
    return above < (h * pct + 50) / 100;
}
#endif
