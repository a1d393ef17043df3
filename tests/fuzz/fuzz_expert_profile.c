/* The routing profile file (model/expert_profile.c, written by `dsv4 profile`, read by GPU loads with --gpu-mem).
 * Input: one byte choosing the model's shape (layers 1..4, experts 1..8, top-k 1..3), then the file's text. A
 * profile that parses must hold what placement relies on (every count at most the tokens, each layer at most
 * top-k per token), and the placement it drives must put exactly the budgeted experts on the GPU. */
#include "fuzz.h"
#include "model/expert_place.h"
#include "model/expert_profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int L = 1 + (data[0] & 3), E = 1 + ((data[0] >> 2) & 7), K = 1 + (data[0] >> 5) % 3;
    expert_profile p;
    dsv4_error err = {0};
    const int rc = expert_profile_parse((const char *)data + 1, size - 1, "profile.json", L, E, K, &p, &err);
    if (rc) {
        fuzz_check_error(rc, &err);
        return 0;
    }
    FUZZ_CHECK(p.n_layers == L && p.n_routed == E, "shape %d x %d, asked %d x %d", p.n_layers, p.n_routed, L, E);
    for (int l = 0; l < L; l++) {
        uint64_t sum = 0;
        for (int e = 0; e < E; e++) {
            FUZZ_CHECK(p.counts[l * E + e] <= p.tokens, "count above the tokens");
            sum += p.counts[l * E + e];
        }
        FUZZ_CHECK(sum / (uint64_t)K <= p.tokens, "layer %d counts more than top-k per token", l);
    }
    for (int64_t n_gpu = 0; n_gpu <= (int64_t)L * E; n_gpu += 1 + (L * E) / 5) {
        expert_map map;
        FUZZ_CHECK(expert_map_plan(&map, L, E, n_gpu, p.counts) == 0, "out of memory");
        int64_t on_gpu = 0;
        for (int l = 0; l < L; l++) on_gpu += expert_map_gpu_count(&map, l);
        FUZZ_CHECK(on_gpu == n_gpu && map.n_host == (int64_t)L * E - n_gpu, "%lld on the GPU for a budget of %lld",
                   (long long)on_gpu, (long long)n_gpu);
        expert_map_free(&map);
    }
    expert_profile_free(&p);
    return 0;
}
