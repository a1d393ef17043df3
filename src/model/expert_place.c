#include "model/expert_place.h"

int expert_first(int E, int n_ranks, int r) {
    const int base = E / n_ranks, extra = E % n_ranks;
    return r * base + (r < extra ? r : extra);
}

int expert_owner(int E, int n_ranks, int e) {
    int r = 0;
    while (r + 1 < n_ranks && expert_first(E, n_ranks, r + 1) <= e) r++;
    return r;
}
