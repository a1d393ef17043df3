/* Expert parallelism's two promises that need no GPU (issue 16): the placement gives every expert of a layer to
 * exactly one rank in contiguous, even ranges; and the gather of the experts' output rows by a sum over ranks
 * (every rank but the owner holding EP_ABSENT_ROW) returns the owner's row bit for bit, whatever order the ranks
 * are added in — the property cuda_ep.c relies on to be identical to one GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "model/expert_place.h"
#include "model/expert_profile.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void placement_partitions_evenly(void **st) {
    (void)st;
    const int Es[] = { 1, 2, 7, 8, 64, 256, 257, 384 };
    for (size_t i = 0; i < sizeof Es / sizeof Es[0]; i++)
        for (int n = 1; n <= 16 && n <= Es[i]; n++) {
            const int E = Es[i];
            assert_int_equal(expert_first(E, n, 0), 0);
            assert_int_equal(expert_first(E, n, n), E);
            for (int r = 0; r < n; r++) {
                const int len = expert_first(E, n, r + 1) - expert_first(E, n, r);
                assert_true(len == E / n || len == E / n + 1);   /* even: sizes differ by at most one */
                if (r) assert_true(len <= expert_first(E, n, 1));  /* the longer ranges come first */
            }
            for (int e = 0; e < E; e++) {
                const int r = expert_owner(E, n, e);
                assert_true(r >= 0 && r < n);
                assert_true(expert_first(E, n, r) <= e && e < expert_first(E, n, r + 1));
            }
        }
    /* hand-worked: 10 experts over 4 ranks -> 3, 3, 2, 2 */
    assert_int_equal(expert_first(10, 4, 1), 3);
    assert_int_equal(expert_first(10, 4, 2), 6);
    assert_int_equal(expert_first(10, 4, 3), 8);
    assert_int_equal(expert_owner(10, 4, 5), 1);
    assert_int_equal(expert_owner(10, 4, 9), 3);
}

/* The values a row can hold, the awkward ones included. */
static float sample(int i) {
    static const uint32_t special[] = { 0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x7f800000u, 0xff800000u,
                                        0x7fc00000u, 0x7f7fffffu, 0xff7fffffu, 0x3f800000u, 0xbf800000u, 0x007fffffu };
    const int ns = (int)(sizeof special / sizeof special[0]);
    if (i < ns) return from_bits(special[i]);
    uint32_t x = (uint32_t)i * 2654435761u;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return from_bits(x);
}

/* Sum the n ranks' values in the order given by perm (left to right), and as a pairwise tree. */
static float sum_in_order(const float *v, const int *perm, int n) {
    float s = v[perm[0]];
    for (int i = 1; i < n; i++) s += v[perm[i]];
    return s;
}
static float sum_tree(const float *v, int lo, int hi) {
    if (hi - lo == 1) return v[lo];
    const int mid = (lo + hi) / 2;
    return sum_tree(v, lo, mid) + sum_tree(v, mid, hi);
}

static void absent_rows_gather_exactly(void **st) {
    (void)st;
    for (int n = 2; n <= 8; n++)
        for (int i = 0; i < 2000; i++) {
            const float x = sample(i);
            for (int owner = 0; owner < n; owner++) {
                float v[8];
                for (int r = 0; r < n; r++) v[r] = r == owner ? x : EP_ABSENT_ROW;
                int fwd[8], rev[8], rot[8];
                for (int r = 0; r < n; r++) { fwd[r] = r; rev[r] = n - 1 - r; rot[r] = (r + i) % n; }
                const float got[4] = { sum_in_order(v, fwd, n), sum_in_order(v, rev, n), sum_in_order(v, rot, n), sum_tree(v, 0, n) };
                for (int k = 0; k < 4; k++) {
                    if (isnan(x)) assert_true(isnan(got[k]));
                    else assert_int_equal(bits(got[k]), bits(x));
                }
            }
        }
}

/* The identity is -0.0f and nothing else: +0.0f would turn a -0 row into +0 (so this test fails if the constant
 * changes). */
static void plus_zero_would_not_do(void **st) {
    (void)st;
    assert_int_equal(bits(EP_ABSENT_ROW), 0x80000000u);
    const float minus_zero = from_bits(0x80000000u), plus_zero = 0.0f;
    assert_int_equal(bits(minus_zero + plus_zero), 0x00000000u);
}

/* ---- host-resident experts (issue 15): which experts stay on the GPU, hand-worked -------------------------- */

static void host_map_even(void **st) {
    (void)st;
    expert_map m;
    /* 3 layers x 4 experts, 5 on the GPU: 5 / 3 = 1 each, the first 5 % 3 = 2 layers one more */
    assert_int_equal(expert_map_plan(&m, 3, 4, 5, NULL), 0);
    static const uint8_t want[3][4] = { {0, 0, 1, 1}, {0, 0, 1, 1}, {0, 1, 1, 1} };
    for (int l = 0; l < 3; l++) {
        for (int e = 0; e < 4; e++) assert_int_equal(expert_on_host(&m, l, e), want[l][e]);
        assert_int_equal(expert_map_gpu_count(&m, l), l < 2 ? 2 : 1);
    }
    assert_int_equal(m.n_host, 7);
    expert_map_free(&m);
    /* everything fits: no map at all; nothing fits: every expert on the host */
    assert_int_equal(expert_map_plan(&m, 3, 4, 12, NULL), 0);
    assert_null(m.owner);
    assert_int_equal(m.n_host, 0);
    assert_false(expert_on_host(&m, 2, 3));
    assert_int_equal(expert_map_plan(&m, 3, 4, 0, NULL), 0);
    for (int l = 0; l < 3; l++) assert_int_equal(expert_map_gpu_count(&m, l), 0);
    assert_int_equal(m.n_host, 12);
    expert_map_free(&m);
}

static void host_map_by_profile(void **st) {
    (void)st;
    /* counts: layer 0 = 5 0 2, layer 1 = 5 9 1. Three GPU places: (1,1)=9, then the two 5s, the lower layer first */
    const uint64_t counts[6] = { 5, 0, 2, 5, 9, 1 };
    expert_map m;
    assert_int_equal(expert_map_plan(&m, 2, 3, 3, counts), 0);
    static const uint8_t want[2][3] = { {0, 1, 1}, {0, 0, 1} };
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < 3; e++) assert_int_equal(expert_on_host(&m, l, e), want[l][e]);
    expert_map_free(&m);
    /* equal counts: the lower (layer, expert) first */
    const uint64_t flat[6] = { 1, 1, 1, 1, 1, 1 };
    assert_int_equal(expert_map_plan(&m, 2, 3, 4, flat), 0);
    assert_false(expert_on_host(&m, 0, 2));
    assert_false(expert_on_host(&m, 1, 0));
    assert_true(expert_on_host(&m, 1, 1));
    assert_true(expert_on_host(&m, 1, 2));
    expert_map_free(&m);
}

/* The bus share, hand-worked: 2 layers x 8 experts, 3 on the GPU (layer 0 keeps 0, 1; layer 1 keeps 0), so layer 0
 * has host experts 2..7 (6 of them) and layer 1 has 1..7 (7). At 50 %: the i-th host expert goes to the bus when
 * floor((i + 1) / 2) > floor(i / 2), i.e. i odd: layer 0 experts 3, 5, 7; layer 1 experts 2, 4, 6. At 30 %:
 * floor(3 (i + 1) / 10) steps at i = 3 and i = 6: layer 0 (i up to 5) expert 5; layer 1 experts 4 and 7. */
/* Routing counts over a placement (inspect, bench): the half split of host_map_bus_share below, counts worked by
 * hand. Layer 0 counts 1..8, layer 1 counts 8..1; owners {0,0,1,2,1,2,1,2} and {0,1,2,1,2,1,2,1}: GPU 1+2+8 = 11,
 * host cores 3+5+7 + 7+5+3+1 = 31, bus 4+6+8 + 6+4+2 = 30, of 72; experts 3 / 7 / 6 of 16. */
static void route_shares_by_owner(void **st) {
    (void)st;
    expert_map m;
    assert_int_equal(expert_map_plan(&m, 2, 8, 3, NULL), 0);
    expert_map_split_bus(&m, 50, 2, NULL, 0);
    const uint64_t counts[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1 };
    double share[EXPERT_OWNERS], uniform[EXPERT_OWNERS];
    expert_map_route_shares(&m, counts, share, uniform);
    assert_true(share[EXPERT_ON_GPU] == 11.0 / 72 && share[EXPERT_ON_HOST] == 31.0 / 72 && share[EXPERT_ON_BUS] == 30.0 / 72);
    assert_true(uniform[EXPERT_ON_GPU] == 3.0 / 16 && uniform[EXPERT_ON_HOST] == 7.0 / 16 && uniform[EXPERT_ON_BUS] == 6.0 / 16);
    expert_map_route_shares(&m, NULL, share, uniform);   /* no counts: no shares */
    assert_true(share[0] == 0 && share[1] == 0 && share[2] == 0 && uniform[1] == 7.0 / 16);
    expert_map_free(&m);
    assert_int_equal(expert_map_plan(&m, 2, 8, 16, NULL), 0);   /* everything on the GPU */
    expert_map_route_shares(&m, counts, share, uniform);
    assert_true(share[EXPERT_ON_GPU] == 1 && share[EXPERT_ON_HOST] == 0 && uniform[EXPERT_ON_GPU] == 1);
    expert_map_free(&m);
}

/* The token split's rule (model/expert_split.h), hand-worked on one layer of 12 experts, the odd ones split, the even
 * ones elsewhere. Row {1, 2, 3, 5, 8, 9}: split experts 1, 3, 5, 9 (h = 4). At 25 %: floor((100 + 50) / 100) = 1 goes
 * over the bus, the highest: 9. At 50 %: floor(250 / 100) = 2: 9 and 5. At 0 % none, at 100 % all four. At 10 %:
 * floor(90 / 100) = 0. Row {3, 3, 7, 0, 11, 4} names 3 twice: h = 3 (3, 7, 11); at 50 %: floor(200 / 100) = 2: 11, 7. */
static void split_rule_by_hand(void **st) {
    (void)st;
    uint8_t owner[12];
    for (int e = 0; e < 12; e++) owner[e] = e % 2 ? EXPERT_ON_SPLIT : e % 4 ? EXPERT_ON_GPU : EXPERT_ON_HOST;
    const int32_t row[6] = { 1, 2, 3, 5, 8, 9 }, dup[6] = { 3, 3, 7, 0, 11, 4 };
    const int split[4] = { 1, 3, 5, 9 };
    for (int i = 0; i < 4; i++) {
        const int e = split[i];
        assert_int_equal(expert_split_on_bus(owner, row, 6, e, 25), e == 9);
        assert_int_equal(expert_split_on_bus(owner, row, 6, e, 50), e == 9 || e == 5);
        assert_int_equal(expert_split_on_bus(owner, row, 6, e, 0), 0);
        assert_int_equal(expert_split_on_bus(owner, row, 6, e, 100), 1);
        assert_int_equal(expert_split_on_bus(owner, row, 6, e, 10), 0);
    }
    assert_int_equal(expert_split_on_bus(owner, dup, 6, 3, 50), 0);
    assert_int_equal(expert_split_on_bus(owner, dup, 6, 7, 50), 1);
    assert_int_equal(expert_split_on_bus(owner, dup, 6, 11, 50), 1);
    assert_int_equal(expert_split_on_bus(owner, dup, 6, 3, 60), 0);    /* floor(230 / 100) = 2 */
    assert_int_equal(expert_split_on_bus(owner, dup, 6, 3, 90), 1);    /* floor(320 / 100) = 3 */
}

/* expert_map_split_tokens: every expert in host memory becomes split (2 layers x 8, 3 on the GPU: 13 on the host),
 * unless they are more than the room. */
static void host_map_split_tokens(void **st) {
    (void)st;
    expert_map m;
    assert_int_equal(expert_map_plan(&m, 2, 8, 3, NULL), 0);
    expert_map_split_bus(&m, 50, 2, NULL, 0);   /* a bus split before: the token split replaces it */
    assert_int_equal(expert_map_split_tokens(&m, 30, 12), -1);   /* 13 experts do not fit in 12 */
    assert_int_equal(m.n_split, 0);
    assert_int_equal(m.owner[3], EXPERT_ON_BUS);   /* unchanged */
    assert_int_equal(expert_map_split_tokens(&m, 30, 13), 0);
    assert_int_equal(m.n_split, 13);
    assert_int_equal(m.n_bus, 0);
    assert_int_equal(m.split_pct, 30);
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < 8; e++)
            assert_int_equal(expert_owner_of(&m, l, e), (l == 0 ? e < 2 : e < 1) ? EXPERT_ON_GPU : EXPERT_ON_SPLIT);
    assert_int_equal(m.n_host, 13);
    expert_map_free(&m);
    assert_int_equal(expert_map_plan(&m, 2, 8, 16, NULL), 0);   /* everything on the GPU: nothing to split */
    assert_int_equal(expert_map_split_tokens(&m, 30, 0), 0);
    assert_int_equal(m.n_split, 0);
    expert_map_free(&m);
}

static void host_map_bus_share(void **st) {
    (void)st;
    expert_map m;
    assert_int_equal(expert_map_plan(&m, 2, 8, 3, NULL), 0);
    expert_map_split_bus(&m, 50, 2, NULL, 0);
    static const uint8_t half[2][8] = { {0, 0, 1, 2, 1, 2, 1, 2}, {0, 1, 2, 1, 2, 1, 2, 1} };
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < 8; e++) {
            assert_int_equal(expert_owner_of(&m, l, e), half[l][e]);
            assert_int_equal(expert_on_host(&m, l, e), half[l][e] != 0);   /* bus experts are in host memory too */
        }
    assert_int_equal(m.n_host, 13);
    assert_int_equal(m.n_bus, 6);
    assert_int_equal(expert_map_gpu_count(&m, 0), 2);
    /* the split is a function of the placement and the share alone: splitting again (another share) starts over */
    expert_map_split_bus(&m, 30, 2, NULL, 0);
    static const uint8_t third[2][8] = { {0, 0, 1, 1, 1, 2, 1, 1}, {0, 1, 1, 1, 2, 1, 1, 2} };
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < 8; e++) assert_int_equal(expert_owner_of(&m, l, e), third[l][e]);
    assert_int_equal(m.n_bus, 3);
    /* 0 %: nothing on the bus; 100 %: every host expert; out-of-range shares are clamped */
    expert_map_split_bus(&m, 0, 2, NULL, 0);
    assert_int_equal(m.n_bus, 0);
    expert_map_split_bus(&m, 100, 2, NULL, 0);
    assert_int_equal(m.n_bus, 13);
    expert_map_split_bus(&m, 250, 2, NULL, 0);
    assert_int_equal(m.n_bus, 13);
    expert_map_split_bus(&m, -5, 2, NULL, 0);
    assert_int_equal(m.n_bus, 0);
    for (int e = 2; e < 8; e++) assert_int_equal(expert_owner_of(&m, 0, e), EXPERT_ON_HOST);
    /* the option's values: 0 = the default (auto), negative = none, above 1 or NaN = invalid */
    assert_int_equal(expert_bus_pct(0), EXPERT_BUS_AUTO);
    assert_int_equal(expert_bus_pct(-1), 0);
    assert_int_equal(expert_bus_pct(0.25), 25);
    assert_int_equal(expert_bus_pct(1), 100);
    assert_int_equal(expert_bus_pct(1.01), -1);
    assert_int_equal(expert_bus_pct(NAN), -1);
    /* the default by the experts (no profile): r = n_act x n_host / (L x E); 25 % where r >= 4, 15 % where r >= 2,
     * 100 % where r < 0.25 (and the room holds them all), else none. 13 of 16 on the host: top-2 gives 26 / 16 < 2,
     * none; top-3 gives 39 / 16 >= 2; top-5 gives 65 / 16 >= 4; top-4 gives 52 / 16 < 4; 11 of 16 at top-3: 33 / 16
     * >= 2; 10 of 16: 30 / 16 < 2 */
    assert_int_equal(expert_bus_auto_pct(&m, 2, NULL, 1000), 0);
    assert_int_equal(expert_bus_auto_pct(&m, 3, NULL, 1000), 15);
    assert_int_equal(expert_bus_auto_pct(&m, 4, NULL, 1000), 15);
    assert_int_equal(expert_bus_auto_pct(&m, 5, NULL, 1000), 25);
    /* by a profile's routes instead: the 3 GPU experts take 100 routes each, the 13 host ones 1 each: r = 2 x 13 / 313
     * = 0.083 < 0.25, every host expert over the bus; unless the room is short of the 13 */
    uint64_t counts[16];
    for (int i = 0; i < 16; i++) counts[i] = expert_on_host(&m, i / 8, i % 8) ? 1 : 100;
    assert_int_equal(expert_bus_auto_pct(&m, 2, counts, 13), 100);
    assert_int_equal(expert_bus_auto_pct(&m, 2, counts, 12), 0);
    assert_int_equal(expert_map_split_bus(&m, EXPERT_BUS_AUTO, 2, counts, 13), 100);
    assert_int_equal(m.n_bus, 13);
    /* routes only to host experts: r = 2 x 1 = 2, 15 % (by the experts it would be 26 / 16: none); at top-4, r = 4:
     * 25 % */
    for (int i = 0; i < 16; i++) counts[i] = expert_on_host(&m, i / 8, i % 8) ? 10 : 0;
    assert_int_equal(expert_bus_auto_pct(&m, 2, counts, 1000), 15);
    assert_int_equal(expert_bus_auto_pct(&m, 4, counts, 1000), 25);
    /* a profile that counted nothing: by the experts */
    memset(counts, 0, sizeof counts);
    assert_int_equal(expert_bus_auto_pct(&m, 2, counts, 1000), 0);
    expert_map_free(&m);
    assert_int_equal(expert_map_plan(&m, 2, 8, 5, NULL), 0);
    assert_int_equal(expert_bus_auto_pct(&m, 3, NULL, 1000), 15);
    expert_map_free(&m);
    assert_int_equal(expert_map_plan(&m, 2, 8, 6, NULL), 0);
    assert_int_equal(expert_bus_auto_pct(&m, 3, NULL, 1000), 0);
    expert_map_free(&m);
    /* 1 of 16 on the host: top-2 gives 2 / 16 = 0.125 < 0.25, the bus takes it; top-4 gives 0.25, not below: none */
    assert_int_equal(expert_map_plan(&m, 2, 8, 15, NULL), 0);
    assert_int_equal(expert_bus_auto_pct(&m, 2, NULL, 1000), 100);
    assert_int_equal(expert_bus_auto_pct(&m, 2, NULL, 0), 0);
    assert_int_equal(expert_bus_auto_pct(&m, 4, NULL, 1000), 0);
    expert_map_free(&m);
    /* everything on the GPU: no map, nothing to split */
    assert_int_equal(expert_map_plan(&m, 2, 8, 16, NULL), 0);
    expert_map_split_bus(&m, 50, 2, NULL, 0);
    assert_null(m.owner);
    assert_int_equal(m.n_bus, 0);
    assert_int_equal(expert_owner_of(&m, 1, 7), EXPERT_ON_GPU);
}

static int parse(const char *text, expert_profile *p, dsv4_error *err) {
    return expert_profile_parse(text, strlen(text), "p.json", 2, 3, 2, p, err);
}

static void profile_file(void **st) {
    (void)st;
    dsv4_error err;
    expert_profile p;
    /* a valid profile, read field by field */
    assert_int_equal(parse("{\"dsv4_expert_profile\":1,\"n_layers\":2,\"n_routed\":3,\"tokens\":4,"
                           "\"counts\":[[4,3,1],[0,2,2]]}", &p, &err), 0);
    assert_int_equal(p.tokens, 4);
    const uint64_t want[6] = { 4, 3, 1, 0, 2, 2 };
    for (int i = 0; i < 6; i++) assert_int_equal(p.counts[i], want[i]);
    /* save and load again: the same counts */
    char path[] = "/tmp/dsv4_profile_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(expert_profile_save(&p, path, &err), 0);
    expert_profile q;
    assert_int_equal(expert_profile_load(path, 2, 3, 2, &q, &err), 0);
    assert_int_equal(q.tokens, 4);
    assert_memory_equal(q.counts, p.counts, sizeof want);
    expert_profile_free(&q);
    expert_profile_free(&p);
    /* a model of another shape refuses it, naming the file */
    assert_int_equal(expert_profile_load(path, 3, 3, 2, &q, &err), DSV4_E_FORMAT);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "the model has 3 x 3"));
    unlink(path);
    assert_int_equal(expert_profile_load(path, 2, 3, 2, &q, &err), DSV4_E_IO);
    /* damaged files: each a clear error, and *p untouched */
    static const char *const bad[][2] = {
        { "{\"dsv4_expert_profile\":1,", "not JSON" },
        { "[1,2]", "not an expert profile" },
        { "{\"dsv4_expert_profile\":2,\"n_layers\":2,\"n_routed\":3,\"tokens\":4,\"counts\":[]}", "version 2" },
        { "{\"dsv4_expert_profile\":1,\"n_layers\":2,\"n_routed\":3,\"tokens\":-4,\"counts\":[]}", "non-negative" },
        { "{\"dsv4_expert_profile\":1,\"n_layers\":2,\"n_routed\":3,\"tokens\":4,\"counts\":[[1,1,1]]}", "array of 2 layers" },
        { "{\"dsv4_expert_profile\":1,\"n_layers\":2,\"n_routed\":3,\"tokens\":4,\"counts\":[[1,1,1],[1,1]]}", "counts[1]" },
        { "{\"dsv4_expert_profile\":1,\"n_layers\":2,\"n_routed\":3,\"tokens\":4,\"counts\":[[1,1,1],[1,\"1\",1]]}", "counts[1][1]" },
        { "{\"dsv4_expert_profile\":1,\"n_layers\":2,\"n_routed\":3,\"tokens\":4,\"counts\":[[1,5,1],[1,1,1]]}", "counts[0][1]" },
        { "{\"dsv4_expert_profile\":1,\"n_layers\":2,\"n_routed\":3,\"tokens\":4,\"counts\":[[4,4,1],[1,1,1]]}", "more than 4 tokens x top-2" },
        { "{\"dsv4_expert_profile\":1,\"dsv4_expert_profile\":1}", "not JSON" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&p, 0x5a, sizeof p);
        assert_int_equal(parse(bad[i][0], &p, &err), DSV4_E_FORMAT);
        if (!strstr(err.msg, bad[i][1])) fail_msg("case %zu: '%s' does not say '%s'", i, err.msg, bad[i][1]);
        assert_int_equal(p.n_layers, 0x5a5a5a5a);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(host_map_bus_share),
        cmocka_unit_test(split_rule_by_hand),
        cmocka_unit_test(host_map_split_tokens),
        cmocka_unit_test(route_shares_by_owner),
        cmocka_unit_test(placement_partitions_evenly),
        cmocka_unit_test(absent_rows_gather_exactly),
        cmocka_unit_test(plus_zero_would_not_do),
        cmocka_unit_test(host_map_even),
        cmocka_unit_test(host_map_by_profile),
        cmocka_unit_test(profile_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
