/* Where each routed expert lives when one model is spread over several GPUs (expert parallelism, DESIGN §8.4).
 *
 * Every main layer cuts its E experts into n_ranks contiguous ranges, the first E % n_ranks ranges one expert
 * longer: rank r owns [expert_first(E, n, r), expert_first(E, n, r + 1)). Contiguous and even in every layer,
 * because each layer's routed work is split the same way: a rank that owned none of a layer's experts would sit
 * idle through that layer. Rank 0 also holds everything that is not a routed expert (attention, router, shared
 * expert, head, the MTP / DSpark blocks with all their experts) and every sequence's state, so the placement
 * never touches state: a state saved on n GPUs restores on one and the other way round.
 *
 * Which rank computes an expert's output never changes the output: each (token, expert) row is computed by the
 * same kernel on the same inputs on whichever GPU owns it, and gathered back exactly (cuda_ep.c). */
#ifndef DSV4_MODEL_EXPERT_PLACE_H
#define DSV4_MODEL_EXPERT_PLACE_H

/* What a GPU writes for the output rows of an expert it does not hold, before the rows of all GPUs are summed
 * onto rank 0: -0.0f is the one additive identity of IEEE arithmetic (x + -0.0f == x bit for bit for every x, +0
 * and -0 included; +0.0f would turn a -0 row into +0), so the sum is the owner's row whatever order it is
 * added in (tests/unit/test_expert_place.c). */
#define EP_ABSENT_ROW (-0.0f)

/* ---- experts that stay in host memory (issue 15) ----------------------------------------------------------
 *
 * When the routed experts do not all fit in the GPU memory budget, the loader keeps every other weight on the
 * GPU and as many routed experts of the main layers as the budget holds; the rest stay in host memory (the
 * mmap'd checkpoint) and the host's cores compute them. Which ones stay on the GPU:
 *   - with a routing profile (model/expert_profile.h): the most used, over all layers: (layer, expert) pairs in
 *     decreasing count, ties to the lower layer, then the lower expert;
 *   - without one: spread evenly, every layer keeps n_gpu / L experts and the first n_gpu % L layers one more;
 *     within a layer the lowest expert ids.
 * The choice is a function of the budget, the shape and the profile alone, so `dsv4 inspect --gpu-mem` shows
 * what a GPU load with the same budget will do. Where an expert lives never changes the output beyond the
 * per-kernel difference between the CPU's and the GPU's expert kernels: each (token, expert) row is computed
 * from the same inputs and combined in the same order (increasing expert id), docs/HOST_EXPERTS.md. */

#include "dsv4.h"
#include "model/expert_split.h"
#include <stdint.h>

/* owner values: in GPU memory; in host memory, computed by the host's cores; in host memory (page-locked), computed
 * by the GPU, whose expert kernels read the weights over the bus (PCIe) as they run; and EXPERT_ON_SPLIT
 * (model/expert_split.h: page-locked, each token's routes to it split between the two by a rule) */
#define EXPERT_ON_GPU  0
#define EXPERT_ON_HOST 1
#define EXPERT_ON_BUS  2
#define EXPERT_OWNERS  4   /* the owner values, EXPERT_ON_SPLIT included */

typedef struct {
    int n_layers, n_routed;
    uint8_t *owner;      /* [n_layers][n_routed]: EXPERT_ON_*; NULL = every expert on the GPU */
    int64_t n_host;      /* experts in host memory (EXPERT_ON_HOST and EXPERT_ON_BUS) */
    int64_t n_bus;       /* of those, read by the GPU over the bus */
    int64_t n_split;     /* of those, split by token (EXPERT_ON_SPLIT) */
    int split_pct;       /* the token split's share (expert_split.h), percent */
} expert_map;

/* Place n_gpu of the L x E routed experts on the GPU (n_gpu >= L*E: all of them, owner stays NULL). counts:
 * a profile's [L][E] counts, or NULL. Returns 0, or -1 when out of memory. */
int  expert_map_plan(expert_map *map, int L, int E, int64_t n_gpu, const uint64_t *counts);
void expert_map_free(expert_map *map);
/* In host memory (whoever computes it). */
static inline int expert_on_host(const expert_map *map, int layer, int e) {
    return map->owner && map->owner[(int64_t)layer * map->n_routed + e] != EXPERT_ON_GPU;
}
static inline int expert_owner_of(const expert_map *map, int layer, int e) {
    return map->owner ? map->owner[(int64_t)layer * map->n_routed + e] : EXPERT_ON_GPU;
}
/* Experts of layer l in GPU memory. */
int  expert_map_gpu_count(const expert_map *map, int layer);
/* How routing counts ([n_layers][n_routed], a profile's or a run's) fall on the placement: share[o] = the counts of
 * the experts with owner o (EXPERT_ON_GPU, _HOST, _BUS, _SPLIT) over all counts, all layers together; uniform[o] =
 * the share of the experts themselves (what uniform routing would give). All zero when there are no counts. */
void expert_map_route_shares(const expert_map *map, const uint64_t *counts, double share[EXPERT_OWNERS],
                             double uniform[EXPERT_OWNERS]);

/* The bus share (issue 15): of each layer's experts in host memory, bus_pct percent (0..100) are read and computed
 * by the GPU instead of the host's cores. Within a layer, the host experts in increasing id take turns by a fixed
 * rule — the i-th (from 0) goes to the bus when floor((i + 1) p / 100) > floor(i p / 100) — so the bus experts are
 * spread over the ids, and each layer with h host experts gives floor(h p / 100) of them to the bus. Where an
 * expert is computed is a function of the placement and the share alone, never of a step's routing: a token's
 * rows come from the same kernel whatever its neighbours (batch invariance). Call after expert_map_plan. bus_pct
 * EXPERT_BUS_AUTO takes expert_bus_auto_pct(map, n_act, counts, bus_room). Returns the percent used. */
int  expert_map_split_bus(expert_map *map, int bus_pct, int n_act, const uint64_t *counts, int64_t bus_room);
/* dsv4_load_opts.bus_share as that percent (negative = none), EXPERT_BUS_AUTO for 0 (the default), or -1 when above
 * 1 or NaN. */
#define EXPERT_BUS_AUTO (-2)
int  expert_bus_pct(double share);
/* The default share for a placement, from r = n_act x f: a token's expected routes to one layer's experts in host
 * memory, f the share of the profile's routes (counts, [n_layers][n_routed], when it counted any) that go to them,
 * else the share of the experts themselves.
 *   r < 0.25, and all of them fit in bus_room experts: 100 — every host expert over the bus. Such a layer's host
 *     experts are rarely routed; a hand-off to the host costs every layer of every step (the routing copied back,
 *     the host's turn, the GPU's launches made directly instead of as CUDA graphs), the bus only the routed ones,
 *     and with none left on the host the step runs as CUDA graphs. Measured on an H200 (docs/GPU_RUNS.md runs
 *     127-131): Flash at --gpu-mem 132 placed by a profile, 0.1-2 % of routes in host memory, decodes at 77-87 tok/s
 *     with the host computing them and 97-110 with them all over the bus (the all-GPU step: 121).
 *   r >= 2: the bus and the host's cores each take part of a layer's host bytes. A layer waits for the slower
 *     side, and at batch 1 a bus expert (~0.35-0.5 ms for 13.4 MB) is slower than the host's (~0.2-0.3 ms), so the
 *     bus pays only where the host has several experts a layer (run 118: --gpu-mem 80 and 24, +6-16 % decode, +40 %
 *     prefill): 25 where r >= 4 (--gpu-mem 24 evenly, r ~ 5.3: 0.25 the best of 0 / 0.25 / 0.3 in run 118), else 15
 *     (--gpu-mem 72-80 evenly, r ~ 3: 0.15 decoded 10-25 % faster than 0.25 in runs 186 and 188).
 *   otherwise 0 (run 120: --gpu-mem 132, r = 0.58, 63 tok/s against 55-57 with the bus).
 * A function of the placement, the profile and the room alone. */
int  expert_bus_auto_pct(const expert_map *map, int n_act, const uint64_t *counts, int64_t bus_room);
/* The token split (model/expert_split.h, `--bus-by-token`): every expert in host memory becomes EXPERT_ON_SPLIT, and
 * of each token's routes to a layer's split experts about pct percent (0..100) are computed by the GPU over the bus,
 * the rest by the host's cores. All of them are page-locked, so they must fit in bus_room experts: returns 0 (also
 * when every expert is on the GPU), or -1 when they do not fit (the map unchanged). Call after expert_map_plan, instead of expert_map_split_bus. */
int  expert_map_split_tokens(expert_map *map, int pct, int64_t bus_room);
/* The token split's default share (percent): see expert_place.c. */
#define EXPERT_SPLIT_PCT 25
/* The token split's share for dsv4_load_opts.bus_share (> 0: that share; 0: EXPERT_SPLIT_PCT), percent; -1 when it
 * is negative (no bus), above 1 or NaN. */
int  expert_split_pct(double share);

/* The experts of expert_bytes each that may go over the bus all at once: 60 % of the machine's memory (page-locked;
 * the share of it cuda_host_experts.c gives synthetic host experts). */
int64_t expert_bus_room(uint64_t expert_bytes);

struct dsv4_model;
/* The placement for a GPU budget of gpu_bytes for the weights: every weight but the main layers' routed experts
 * (fixed_bytes, returned), then as many routed experts as fit (each expert_bytes, returned). counts: a profile's
 * [L][E] counts or NULL. DSV4_E_NOMEM with the numbers when not even the other weights fit. */
int  expert_map_for_budget(const struct dsv4_model *m, uint64_t gpu_bytes, const uint64_t *counts, expert_map *map,
                           uint64_t *fixed_bytes, uint64_t *expert_bytes, dsv4_error *err);

/* The first expert of rank r (r = n_ranks gives E). */
int expert_first(int E, int n_ranks, int r);
/* The rank that owns expert e (0 <= e < E). */
int expert_owner(int E, int n_ranks, int e);
#endif
