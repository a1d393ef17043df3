/* tools/gpu/shim/shim_mhc.sh's test: the mHC and routing kernels as they were (namespace v0: DSV4_MHC_FAST=0,
 * DSV4_MOE_FAST=0) and as rewritten for one-token latency (v1: both on), run on the same inputs through the CPU shim.
 * Every output byte must be equal: hc_pre_finish (u, post / comb, xn, the packed row and its scales; with and
 * without the norm and the pack), rmsnorm (in place or not, packed or not), hc_post and hc_post_moe (the streams),
 * the routing (scores written back, picks, weights; top-k with ties and NaN, and hash rows) and the MoE plan (pairs,
 * weights, tiles, token lists), for decode (T = 1, 2, 3, 8, 64) and prefill-like (T = 65..2100) shapes, in both
 * numeric modes. The plan is also checked against a host reference written from its definition (cu_kernels.h), so
 * that it cannot pass by the two kernels agreeing on something wrong. Prints each case; exits 1 at the first
 * difference. */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
extern "C" {
#include "backend/cuda/cu_kernels.h"
}

#define DECLARE(NS)                                                                                                             \
    namespace NS {                                                                                                              \
    void cu_hc_pre_finish(cu_stream st, int official, const float *mixraw, const float *X, int T, int hc, int d,               \
                          const float *base, const float *scale, float hc_eps, float norm_eps, int iters, float *u, float *mix, \
                          const float *norm, float *xn, uint8_t *xq, int ldq, float *xqs, int lds, uint16_t *xb, int ldb);     \
    void cu_rmsnorm(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y, int ldy,    \
                    int rows);                                                                                                 \
    void cu_rmsnorm_pack(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y,       \
                         int ldy, int rows, uint8_t *q, int ldq, float *qs, int lds);                                          \
    void cu_hc_post(cu_stream st, int official, const float *f, const float *mix, float *X, int T, int hc, int d);             \
    void cu_hc_post_moe(cu_stream st, int official, const float *ey, const float *shared, const int32_t *token_pairs, int K,   \
                        const float *mix, float *X, int T, int hc, int d);                                                     \
    void cu_route(cu_stream st, float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int T, int E,    \
                  int K, float route_scale, int32_t *route_e, float *route_w);                                                 \
    void cu_moe_plan_build(cu_stream st, const int32_t *route_e, const float *route_w, int T, int K, int E, cu_moe_plan *p);   \
    int cu_route_plan(cu_stream st, float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int T, int E, \
                      int K, float route_scale, int32_t *route_e, float *route_w, cu_moe_plan *p);                             \
    }
DECLARE(v0)
DECLARE(v1)

#include "shim_rng.h"
/* values over many binades, with zeros, bf16-exact values and the odd large one */
static void fill(std::vector<float> &x, float scale) {
    for (auto &v : x) {
        const int k = below(16);
        v = k == 0   ? 0.0f
            : k == 1 ? 448.0f * (float)(1 + below(3))
            : k == 2 ? (float)below(9) * 0.25f
                     : frand(scale * ldexpf(1.0f, below(8) - 4));
    }
}

static int failures;
template <typename T> static void same(const char *what, const std::vector<T> &a, const std::vector<T> &b) {
    if (a.size() != b.size() || memcmp(a.data(), b.data(), sizeof(T) * a.size())) {
        size_t i = 0;
        while (i < a.size() && !memcmp(&a[i], &b[i], sizeof(T))) i++;
        printf("FAIL %s: differs at element %zu of %zu\n", what, i, a.size());
        failures++;
    }
}
static void check_done(const char *name) {
    if (failures) {
        printf("FAILED: %s\n", name);
        exit(1);
    }
    printf("ok   %s\n", name);
}

static void hc_pre_case(int T, int d, int official, int with_norm, int with_pack) {
    const int n = 4 * d, nmix = 24, ldq = d + 16, lds = d / 128 + 3;
    std::vector<float> X((size_t)T * n), mixraw((size_t)T * nmix), base(nmix), scale(3), norm(d);
    fill(X, 2.0f);
    if (official)
        for (auto &v : X) {   /* the streams are bf16 there */
            uint32_t b;
            memcpy(&b, &v, 4);
            b &= 0xffff0000u;
            memcpy(&v, &b, 4);
        }
    for (auto &v : mixraw) v = frand(30.0f);
    for (auto &v : base) v = frand(1.0f);
    for (auto &v : scale) v = 0.5f + frand(0.5f);
    for (auto &v : norm) v = 1.0f + frand(0.5f);
    struct out {
        std::vector<float> u, mix, xn, xqs;
        std::vector<uint8_t> xq;
        std::vector<uint16_t> xb;
    } o[2];
    for (int v = 0; v < 2; v++) {
        o[v].u.assign((size_t)T * d, -7.0f);
        o[v].mix.assign((size_t)T * CU_MIX, -7.0f);
        o[v].xn.assign((size_t)T * d, -7.0f);
        o[v].xqs.assign((size_t)T * lds, -7.0f);
        o[v].xq.assign((size_t)T * ldq, 0xa5);
        o[v].xb.assign((size_t)T * (d + 8), 0x5a5a);
        auto f = v ? v1::cu_hc_pre_finish : v0::cu_hc_pre_finish;
        f(nullptr, official, mixraw.data(), X.data(), T, 4, d, base.data(), scale.data(), 1e-6f, 1e-6f, 20, o[v].u.data(),
          o[v].mix.data(), with_norm ? norm.data() : nullptr, o[v].xn.data(), with_pack ? o[v].xq.data() : nullptr, ldq,
          o[v].xqs.data(), lds, with_pack ? o[v].xb.data() : nullptr, d + 8);
    }
    same("hc_pre u", o[0].u, o[1].u);
    same("hc_pre mix", o[0].mix, o[1].mix);
    same("hc_pre xn", o[0].xn, o[1].xn);
    same("hc_pre xq", o[0].xq, o[1].xq);
    same("hc_pre xqs", o[0].xqs, o[1].xqs);
    same("hc_pre xb", o[0].xb, o[1].xb);
    for (int t = 0; with_pack && t < T; t++)   /* xb is xn in bf16: the same bits as a bf16-valued float's top half */
        for (int e = 0; e < d; e++) {
            uint32_t u;
            memcpy(&u, &o[1].xn[(size_t)t * d + e], 4);
            if (official && o[1].xb[(size_t)t * (d + 8) + e] != (uint16_t)(u >> 16)) {
                printf("FAIL hc_pre: xb[%d][%d] is not xn's bf16\n", t, e);
                failures++;
                t = T;
                break;
            }
        }
    /* the kernels ran: u and the comb were written, and the comb's rows and columns sum to ~1 */
    if (o[1].u[0] == -7.0f || o[1].mix[8] == -7.0f) { printf("FAIL hc_pre: outputs not written\n"); failures++; }
    for (int t = 0; t < T; t++)
        for (int k = 0; k < 4; k++) {
            float cs = 0;
            for (int j = 0; j < 4; j++) cs += o[1].mix[(size_t)t * CU_MIX + 8 + 4 * j + k];
            if (!(fabsf(cs - 1.0f) < 1e-3f)) { printf("FAIL hc_pre: comb column %d sums to %g\n", k, cs); failures++; }
        }
    if (with_pack && o[1].xqs[0] == -7.0f) { printf("FAIL hc_pre: no scales\n"); failures++; }
    char name[128];
    snprintf(name, sizeof name, "hc_pre_finish T=%d d=%d %s%s%s", T, d, official ? "official" : "exact", with_norm ? " +norm" : "",
             with_pack ? " +pack" : "");
    check_done(name);
}

static void rmsnorm_case(int T, int n, int official, int in_place, int with_pack) {
    const int ldx = n + 8, ldq = n + 16, lds = n / 128 + 3;
    std::vector<float> x((size_t)T * ldx), w(n);
    fill(x, 2.0f);
    for (auto &v : w) v = 1.0f + frand(0.5f);
    std::vector<float> y[2], qs[2];
    std::vector<uint8_t> q[2];
    for (int v = 0; v < 2; v++) {
        y[v] = in_place ? x : std::vector<float>((size_t)T * ldx, -7.0f);
        q[v].assign((size_t)T * ldq, 0xa5);
        qs[v].assign((size_t)T * lds, -7.0f);
        const float *src = in_place ? y[v].data() : x.data();
        if (with_pack)
            (v ? v1::cu_rmsnorm_pack : v0::cu_rmsnorm_pack)(nullptr, official, src, ldx, w.data(), n, 1e-6f, y[v].data(), ldx, T,
                                                            q[v].data(), ldq, qs[v].data(), lds);
        else
            (v ? v1::cu_rmsnorm : v0::cu_rmsnorm)(nullptr, official, src, ldx, w.data(), n, 1e-6f, y[v].data(), ldx, T);
    }
    same("rmsnorm y", y[0], y[1]);
    same("rmsnorm q", q[0], q[1]);
    same("rmsnorm qs", qs[0], qs[1]);
    if (y[1] == x || (!in_place && y[1][0] == -7.0f)) { printf("FAIL rmsnorm: y not written\n"); failures++; }
    if (with_pack && qs[1][0] == -7.0f) { printf("FAIL rmsnorm: no scales\n"); failures++; }
    char name[96];
    snprintf(name, sizeof name, "rmsnorm T=%d n=%d %s%s%s", T, n, official ? "official" : "exact", in_place ? " in place" : "",
             with_pack ? " +pack" : "");
    check_done(name);
}

static void hc_post_case(int T, int d, int official, int K) {
    const int P = T * K + 3;
    std::vector<float> X((size_t)T * 4 * d), f((size_t)T * d), mix((size_t)T * CU_MIX), ey((size_t)P * d), sh((size_t)T * d);
    fill(X, 1.0f);
    fill(f, 1.0f);
    fill(ey, 1.0f);
    fill(sh, 1.0f);
    for (auto &v : mix) v = frand(1.5f);
    std::vector<int32_t> tp((size_t)T * K);
    for (int t = 0; t < T; t++) {
        const int nv = below(K + 1);   /* 0..K pairs, then -1 */
        for (int k = 0; k < K; k++) tp[(size_t)t * K + k] = k < nv ? below(P) : -1;
    }
    std::vector<float> x0 = X, x1 = X;
    v0::cu_hc_post(nullptr, official, f.data(), mix.data(), x0.data(), T, 4, d);
    v1::cu_hc_post(nullptr, official, f.data(), mix.data(), x1.data(), T, 4, d);
    same("hc_post X", x0, x1);
    if (x1 == X) { printf("FAIL hc_post: X unchanged\n"); failures++; }
    x0 = X, x1 = X;
    v0::cu_hc_post_moe(nullptr, official, ey.data(), sh.data(), tp.data(), K, mix.data(), x0.data(), T, 4, d);
    v1::cu_hc_post_moe(nullptr, official, ey.data(), sh.data(), tp.data(), K, mix.data(), x1.data(), T, 4, d);
    same("hc_post_moe X", x0, x1);
    char name[96];
    snprintf(name, sizeof name, "hc_post, hc_post_moe T=%d d=%d K=%d %s", T, d, K, official ? "official" : "exact");
    check_done(name);
}

struct plan_bufs {
    std::vector<int32_t> pair_token, tile_expert, tile_first, tile_count, n_tiles, token_pairs;
    std::vector<float> pair_weight;
    plan_bufs(int T, int K, int E) {
        const size_t P = (size_t)T * K, tiles = P + E;
        pair_token.assign(P, -5); pair_weight.assign(P, -5.0f);
        tile_expert.assign(tiles, -5); tile_first.assign(tiles, -5); tile_count.assign(tiles, -5);
        n_tiles.assign(1, -5); token_pairs.assign(P, -5);
    }
    cu_moe_plan plan() {
        cu_moe_plan p = { pair_token.data(), pair_weight.data(), tile_expert.data(), tile_first.data(), tile_count.data(),
                          n_tiles.data(), token_pairs.data() };
        return p;
    }
};

/* The plan from its definition (cu_kernels.h): pairs by expert then token (a token naming an expert twice counts
 * once), tiles of up to CU_MOE_TILE pairs of one expert, each token's pairs in increasing expert id then -1. */
static void plan_reference(const std::vector<int32_t> &re, const std::vector<float> &rw, int T, int K, int E, plan_bufs &b) {
    int pi = 0, ti = 0;
    std::vector<int> slot_of((size_t)T * E, -1);
    for (int t = 0; t < T; t++) {
        int nv = 0;
        for (int e = 0; e < E; e++)
            for (int j = 0; j < K; j++)
                if (re[(size_t)t * K + j] == e) { slot_of[(size_t)t * E + e] = nv++; break; }
        for (int k = nv; k < K; k++) b.token_pairs[(size_t)t * K + k] = -1;
    }
    for (int e = 0; e < E; e++) {
        const int first = pi;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (re[(size_t)t * K + j] == e) {
                    b.pair_token[pi] = t;
                    b.pair_weight[pi] = rw[(size_t)t * K + j];
                    b.token_pairs[(size_t)t * K + slot_of[(size_t)t * E + e]] = pi;
                    pi++;
                    break;
                }
        for (int q = first; q < pi; q += CU_MOE_TILE, ti++) {
            b.tile_expert[ti] = e;
            b.tile_first[ti] = q;
            b.tile_count[ti] = pi - q < CU_MOE_TILE ? pi - q : CU_MOE_TILE;
        }
    }
    b.n_tiles[0] = ti;
}

/* Every array of two plans byte for byte. */
static void same_plan(const plan_bufs &want, const plan_bufs &got) {
    same("plan pair_token", want.pair_token, got.pair_token);
    same("plan pair_weight", want.pair_weight, got.pair_weight);
    same("plan tile_expert", want.tile_expert, got.tile_expert);
    same("plan tile_first", want.tile_first, got.tile_first);
    same("plan tile_count", want.tile_count, got.tile_count);
    same("plan n_tiles", want.n_tiles, got.n_tiles);
    same("plan token_pairs", want.token_pairs, got.token_pairs);
}

static void route_case(int T, int E, int K, int biased, int hashed, int nans, int ties = 0) {
    std::vector<float> logits((size_t)T * E), bias(E);
    for (auto &v : logits) v = ties || below(5) == 0 ? (float)(below(4) - 2) : frand(4.0f);   /* some ties; ties: nearly all */
    if (nans)
        for (int i = 0; i < T; i++) logits[(size_t)i * E + below(E)] = NAN;
    for (auto &v : bias) v = below(3) == 0 ? 0.0f : frand(0.25f);
    std::vector<int32_t> tok(T), tid2eid((size_t)37 * K);
    for (auto &v : tok) v = below(37);
    for (auto &v : tid2eid) v = below(E);
    std::vector<float> l0 = logits, l1 = logits, w0((size_t)T * K, -7.0f), w1 = w0;
    std::vector<int32_t> e0((size_t)T * K, -9), e1 = e0;
    v0::cu_route(nullptr, l0.data(), biased ? bias.data() : nullptr, hashed ? tid2eid.data() : nullptr, tok.data(), T, E, K, 1.5f,
                 e0.data(), w0.data());
    v1::cu_route(nullptr, l1.data(), biased ? bias.data() : nullptr, hashed ? tid2eid.data() : nullptr, tok.data(), T, E, K, 1.5f,
                 e1.data(), w1.data());
    same("route scores", l0, l1);
    same("route picks", e0, e1);
    same("route weights", w0, w1);
    for (auto v : e1)
        if (v < 0 || v >= E) { printf("FAIL route: pick %d out of range\n", v); failures++; break; }
    /* v1's routing and plan in one launch (cu_route_plan): the same routing bytes, and where it fused (it must for
     * T <= 8 and E <= 512) the plan v0's kernel and the host reference make of v0's routing */
    std::vector<float> l2 = logits, w2((size_t)T * K, -7.0f);
    std::vector<int32_t> e2((size_t)T * K, -9);
    plan_bufs b0(T, K, E), b2(T, K, E), br(T, K, E);
    cu_moe_plan p0 = b0.plan(), p2 = b2.plan();
    const int fused = v1::cu_route_plan(nullptr, l2.data(), biased ? bias.data() : nullptr, hashed ? tid2eid.data() : nullptr,
                                        tok.data(), T, E, K, 1.5f, e2.data(), w2.data(), &p2);
    same("route_plan scores", l0, l2);
    same("route_plan picks", e0, e2);
    same("route_plan weights", w0, w2);
    if (fused != (T <= 8 && E <= 512)) { printf("FAIL route_plan: fused %d at T=%d E=%d\n", fused, T, E); failures++; }
    if (fused) {
        v0::cu_moe_plan_build(nullptr, e0.data(), w0.data(), T, K, E, &p0);
        plan_reference(e0, w0, T, K, E, br);
        same_plan(b0, b2);
        same_plan(br, b2);
    }
    char name[96];
    snprintf(name, sizeof name, "route T=%d E=%d K=%d%s%s%s%s%s", T, E, K, biased ? " bias" : "", hashed ? " hash" : "", nans ? " NaN" : "",
             ties ? " ties" : "", fused ? ", route + plan in one launch" : "");
    check_done(name);
}

static void plan_case(int T, int K, int E, int hot) {
    std::vector<int32_t> re((size_t)T * K);
    std::vector<float> rw((size_t)T * K);
    for (auto &v : re) v = hot && below(2) ? below(hot) : below(E);   /* hot: half the picks among the first experts */
    for (int t = 0; t < T; t += 3) re[(size_t)t * K + K - 1] = re[(size_t)t * K];   /* a row naming an expert twice */
    for (auto &v : rw) v = frand(1.0f);
    plan_bufs b0(T, K, E), b1(T, K, E), br(T, K, E);
    cu_moe_plan p0 = b0.plan(), p1 = b1.plan();
    v0::cu_moe_plan_build(nullptr, re.data(), rw.data(), T, K, E, &p0);
    v1::cu_moe_plan_build(nullptr, re.data(), rw.data(), T, K, E, &p1);
    plan_reference(re, rw, T, K, E, br);
    const plan_bufs *cmp[2] = { &b0, &br };
    for (int c = 0; c < 2; c++) {
        same_plan(*cmp[c], b1);
        if (failures) printf("     (against the %s)\n", c ? "host reference" : "old kernel");
    }
    char name[96];
    snprintf(name, sizeof name, "moe_plan T=%d K=%d E=%d%s (%d tiles)", T, K, E, hot ? " hot experts" : "", b1.n_tiles[0]);
    check_done(name);
}

int main() {
    for (int official = 0; official < 2; official++) {
        hc_pre_case(1, 4096, official, 1, 1);   /* the Flash decode shape */
        hc_pre_case(3, 4096, official, 1, 0);
        hc_pre_case(2, 4096, official, 0, 0);
        hc_pre_case(8, 256, official, 1, 1);    /* the tiny model's */
        hc_pre_case(5, 512, official, 1, 1);
        hc_pre_case(4, 2048, official, 1, 1);
        hc_pre_case(3, 160, official, 1, 1);    /* no fast path: both the old kernel */
        rmsnorm_case(1, 1024, official, 1, 1);   /* q_norm */
        rmsnorm_case(3, 4096, official, 0, 0);   /* the head's */
        rmsnorm_case(2, 256, official, 0, 1);
        rmsnorm_case(4, 512, official, 1, 0);
        rmsnorm_case(2, 160, official, 0, 1);    /* no fast path */
        hc_post_case(1, 4096, official, 6);
        hc_post_case(5, 512, official, 6);
        hc_post_case(3, 256, official, 8);
        hc_post_case(2, 256, official, 11);     /* K > 8: the loop */
    }
    hc_pre_case(64, 1024, 1, 1, 1);
    hc_pre_case(2, 7168, 1, 1, 1);   /* Pro's hidden */
    hc_pre_case(1, 7168, 0, 1, 1);
    rmsnorm_case(2, 1536, 1, 1, 1);  /* Pro's q_lora */
    rmsnorm_case(1, 7168, 0, 0, 1);
    rmsnorm_case(64, 1024, 1, 1, 1);
    route_case(1, 256, 6, 1, 0, 0);   /* Flash: 256 experts, top 6 */
    route_case(64, 256, 6, 1, 0, 0);
    route_case(7, 256, 6, 0, 0, 0);
    route_case(4, 256, 6, 0, 0, 0, 1);
    route_case(3, 384, 8, 0, 0, 1, 1);
    route_case(9, 256, 6, 1, 0, 1);
    route_case(5, 256, 6, 1, 1, 0);   /* hash routing */
    route_case(33, 384, 8, 1, 0, 0);  /* 16 experts a lane */
    route_case(6, 384, 8, 0, 1, 1);
    route_case(10, 8, 2, 1, 0, 0);    /* tiny */
    route_case(3, 16, 16, 1, 0, 1);
    route_case(2, 600, 6, 1, 0, 0);   /* no fast path */
    const int Ts[] = { 1, 2, 3, 8, 64, 65, 200, 256, 300 };
    for (int T : Ts) {
        plan_case(T, 6, 256, 0);
        plan_case(T, 6, 256, 12);
    }
    /* k_moe_plan_big (more than 256 tokens): chunks of 512 tokens, a step across one and across several */
    plan_case(513, 6, 256, 12);
    plan_case(1100, 6, 256, 0);
    plan_case(2100, 8, 384, 20);
    plan_case(40, 8, 384, 5);
    plan_case(17, 2, 8, 0);
    plan_case(256, 16, 16, 3);
    printf("all cases: old and fast kernels give the same bytes\n");
    return 0;
}
