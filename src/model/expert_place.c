#include "model/expert_place.h"
#include "model/footprint.h"
#include "model/model.h"
#include "util/error.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int expert_first(int E, int n_ranks, int r) {
    const int base = E / n_ranks, extra = E % n_ranks;
    return r * base + (r < extra ? r : extra);
}

int expert_owner(int E, int n_ranks, int e) {
    int r = 0;
    while (r + 1 < n_ranks && expert_first(E, n_ranks, r + 1) <= e) r++;
    return r;
}

void expert_map_free(expert_map *map) {
    free(map->owner);
    memset(map, 0, sizeof *map);
}

void expert_map_route_shares(const expert_map *map, const uint64_t *counts, double share[EXPERT_OWNERS],
                             double uniform[EXPERT_OWNERS]) {
    uint64_t by[EXPERT_OWNERS] = { 0 }, all = 0;
    int64_t experts[EXPERT_OWNERS] = { 0 };
    for (int l = 0; l < map->n_layers; l++)
        for (int e = 0; e < map->n_routed; e++) {
            const int o = expert_owner_of(map, l, e);
            const uint64_t c = counts ? counts[(int64_t)l * map->n_routed + e] : 0;
            by[o] += c;
            all += c;
            experts[o]++;
        }
    const double n = (double)map->n_layers * map->n_routed;
    for (int o = 0; o < EXPERT_OWNERS; o++) {
        share[o] = all ? (double)by[o] / (double)all : 0;
        uniform[o] = n > 0 ? (double)experts[o] / n : 0;
    }
}

int expert_map_gpu_count(const expert_map *map, int layer) {
    int n = 0;
    for (int e = 0; e < map->n_routed; e++) n += !expert_on_host(map, layer, e);
    return n;
}

/* One (layer, expert) with its count; sorted by decreasing count, then increasing index: a total order, so the
 * placement never depends on the sort's stability. */
typedef struct {
    uint64_t count;
    int64_t index;   /* layer * E + expert */
} ranked_expert;

static int by_count(const void *a, const void *b) {
    const ranked_expert *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

int expert_map_plan(expert_map *map, int L, int E, int64_t n_gpu, const uint64_t *counts) {
    memset(map, 0, sizeof *map);
    map->n_layers = L;
    map->n_routed = E;
    const int64_t total = (int64_t)L * E;
    if (n_gpu >= total) return 0;
    if (n_gpu < 0) n_gpu = 0;
    if (!(map->owner = malloc((size_t)total))) return -1;
    memset(map->owner, EXPERT_ON_HOST, (size_t)total);
    map->n_host = total - n_gpu;
    if (counts) {
        ranked_expert *order = malloc(sizeof *order * (size_t)total);
        if (!order) {
            expert_map_free(map);
            return -1;
        }
        for (int64_t i = 0; i < total; i++) order[i] = (ranked_expert){ counts[i], i };
        qsort(order, (size_t)total, sizeof *order, by_count);
        for (int64_t i = 0; i < n_gpu; i++) map->owner[order[i].index] = EXPERT_ON_GPU;
        free(order);
    } else {
        for (int l = 0; l < L; l++) {
            const int64_t keep = n_gpu / L + (l < n_gpu % L);
            memset(map->owner + (int64_t)l * E, EXPERT_ON_GPU, (size_t)keep);
        }
    }
    return 0;
}

int expert_map_split_bus(expert_map *map, int bus_pct, int n_act, const uint64_t *counts, int64_t bus_room) {
    if (bus_pct == EXPERT_BUS_AUTO) bus_pct = expert_bus_auto_pct(map, n_act, counts, bus_room);
    if (!map->owner) return bus_pct < 0 ? 0 : bus_pct;
    if (bus_pct < 0) bus_pct = 0;
    if (bus_pct > 100) bus_pct = 100;
    map->n_bus = 0;
    for (int l = 0; l < map->n_layers; l++) {
        uint8_t *o = map->owner + (int64_t)l * map->n_routed;
        int64_t i = 0;   /* the layer's host experts seen so far */
        for (int e = 0; e < map->n_routed; e++) {
            if (o[e] == EXPERT_ON_GPU) continue;
            const int bus = (i + 1) * bus_pct / 100 > i * bus_pct / 100;
            o[e] = bus ? EXPERT_ON_BUS : EXPERT_ON_HOST;
            map->n_bus += bus;
            i++;
        }
    }
    return bus_pct;
}

/* EXPERT_SPLIT_PCT, 25: at batch 1 a layer waits for the slower side, and the bus takes ~0.35-0.5 ms an expert
 * where the host's cores take ~0.2 (runs 118-123, 186): 25 % sends none of a token's one host route over the bus,
 * one of two to five, two of six (floor(h / 4 + 1/2)). */
int expert_map_split_tokens(expert_map *map, int pct, int64_t bus_room) {
    if (!map->owner) return 0;
    if (map->n_host > bus_room) return -1;
    for (int64_t i = 0; i < (int64_t)map->n_layers * map->n_routed; i++)
        if (map->owner[i] != EXPERT_ON_GPU) map->owner[i] = EXPERT_ON_SPLIT;
    map->n_bus = 0;
    map->n_split = map->n_host;
    map->split_pct = pct < 0 ? 0 : pct > 100 ? 100 : pct;
    return 0;
}

int expert_split_pct(double share) {
    const int pct = expert_bus_pct(share);
    return pct == EXPERT_BUS_AUTO ? EXPERT_SPLIT_PCT : share < 0 ? -1 : pct;
}

int expert_bus_pct(double share) {
    if (!(share <= 1)) return -1;
    if (share == 0) return EXPERT_BUS_AUTO;
    return share < 0 ? 0 : (int)lround(share * 100);
}

int expert_bus_auto_pct(const expert_map *map, int n_act, const uint64_t *counts, int64_t bus_room) {
    if (!map->owner) return 0;
    double share[EXPERT_OWNERS], uniform[EXPERT_OWNERS];
    expert_map_route_shares(map, counts, share, uniform);
    /* f: the share of the profile's routes off the GPU when it counted any, else of the experts */
    const double f = share[EXPERT_ON_GPU] + share[EXPERT_ON_HOST] + share[EXPERT_ON_BUS] > 0
                         ? share[EXPERT_ON_HOST] + share[EXPERT_ON_BUS] : uniform[EXPERT_ON_HOST] + uniform[EXPERT_ON_BUS];
    const double r = n_act * f;
    if (r < 0.25 && map->n_host <= bus_room) return 100;
    return r >= 4 ? 25 : r >= 2 ? 15 : 0;
}

int64_t expert_bus_room(uint64_t expert_bytes) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0 || !expert_bytes) return 0;
    return (int64_t)(0.6 * (double)pages * (double)page / (double)expert_bytes);
}

/* "12.34 GiB" or, below 1 GiB, "12.34 MiB": tiny test models and real ones both read well. */
static const char *size_text(char *buf, size_t n, uint64_t b) {
    if (b >= ((uint64_t)1 << 30)) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    return buf;
}

int expert_map_for_budget(const struct dsv4_model *m, uint64_t gpu_bytes, const uint64_t *counts, expert_map *map,
                          uint64_t *fixed_bytes, uint64_t *expert_bytes, dsv4_error *err) {
    const int L = m->cfg.n_layers, E = m->cfg.n_routed;
    uint64_t routed = 0;
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) routed += dsv4_expert_weight_bytes(&m->layers[l], e);
    const uint64_t one = dsv4_expert_weight_bytes(&m->layers[0], 0);   /* every routed expert has one format */
    *fixed_bytes = dsv4_total_weight_bytes(m) - routed;
    *expert_bytes = one;
    memset(map, 0, sizeof *map);
    char need[32], have[32];
    if (gpu_bytes < *fixed_bytes)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory: the weights other than the routed experts need %s, the "
                         "budget is %s", size_text(need, sizeof need, *fixed_bytes), size_text(have, sizeof have, gpu_bytes));
    const int64_t n_gpu = one ? (int64_t)((gpu_bytes - *fixed_bytes) / one) : (int64_t)L * E;
    if (expert_map_plan(map, L, E, n_gpu, counts)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    return DSV4_OK;
}
