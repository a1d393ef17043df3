/* A build without the CUDA backend (plain `make`): asking for the GPU is an error with one clear line. */
#ifndef DSV4_CUDA
#include "backend/cuda/cuda_backend.h"
#include "util/error.h"
#include <string.h>

static int no_cuda(dsv4_error *err) {
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "this build of dsv4 has no CUDA backend (rebuild with `make CUDA=1`)");
}

int cuda_available(int gpu, dsv4_error *why) {
    (void)gpu;
    no_cuda(why);
    return 0;
}
int cuda_model_init(struct dsv4_model *m, const cuda_placement *p, dsv4_error *err) {
    (void)m;
    (void)p;
    return no_cuda(err);
}
int64_t cuda_host_experts(const struct dsv4_model *m, cuda_host_work *w) {
    (void)m;
    if (w) *w = (cuda_host_work){ 0, 0, 0, 0 };
    return 0;
}
int64_t cuda_bus_experts(const struct dsv4_model *m) {
    (void)m;
    return 0;
}
int64_t cuda_split_experts(const struct dsv4_model *m) {
    (void)m;
    return 0;
}
void cuda_hx_fail_next(struct dsv4_model *m, int k) { (void)m, (void)k; }
const uint8_t *cuda_expert_owners(const struct dsv4_model *m) {
    (void)m;
    return NULL;
}
int cuda_count_routes(struct dsv4_model *m, int on, dsv4_error *err) {
    (void)m;
    (void)on;
    return no_cuda(err);
}
int cuda_route_counts(const struct dsv4_model *m, uint64_t *counts, dsv4_error *err) {
    (void)m;
    (void)counts;
    return no_cuda(err);
}
void cuda_model_free(struct dsv4_model *m) { (void)m; }
int cuda_step(struct dsv4_model *m, dsv4_step_item *items, int n_items, dsv4_error *err) {
    (void)m; (void)items; (void)n_items;
    return no_cuda(err);
}
int cuda_mtp_forward(struct dsv4_model *m, dsv4_seq *state, const float *X, const int32_t *next_tokens, int n,
                     dsv4_logits_want want, float *logits, dsv4_error *err) {
    (void)m; (void)state; (void)X; (void)next_tokens; (void)n; (void)want; (void)logits;
    return no_cuda(err);
}
int cuda_dspark_commit(struct dsv4_model *m, float *ring, int64_t pos, const float *features, int n, dsv4_error *err) {
    (void)m; (void)ring; (void)pos; (void)features; (void)n;
    return no_cuda(err);
}
int cuda_dspark_block(struct dsv4_model *m, const float *ring, int64_t pos, const int32_t *ids, int gamma, float *y, float *U,
                      dsv4_error *err) {
    (void)m; (void)ring; (void)pos; (void)ids; (void)gamma; (void)y; (void)U;
    return no_cuda(err);
}
int cuda_dspark_draft(struct dsv4_model *m, const float *ring, int64_t pos, const int32_t *ids, int gamma, int k,
                      const dsv4_sampling *sp, uint64_t draw0, int32_t *draft, float *conf, float *probs, float *U, dsv4_error *err) {
    (void)m; (void)ring; (void)pos; (void)ids; (void)gamma; (void)k; (void)sp; (void)draw0; (void)draft; (void)conf; (void)probs;
    (void)U;
    return no_cuda(err);
}
void cuda_profile(struct dsv4_model *m, int on) { (void)m; (void)on; }
double cuda_copy_bandwidth_gbs(const struct dsv4_model *m) { (void)m; return -1; }
void cuda_profile_report(const struct dsv4_model *m, void *file) { (void)m; (void)file; }
int cuda_gpus(const struct dsv4_model *m) { (void)m; return 0; }
int cuda_distinct_layers(const struct dsv4_model *m) { (void)m; return 0; }
uint64_t cuda_gpu_weight_bytes(const struct dsv4_model *m, int r) { (void)m; (void)r; return 0; }
int cuda_mma_on(const struct dsv4_model *m) {
    (void)m;
    return 0;
}

void cuda_graphs_get(const struct dsv4_model *m, cuda_graph_info *info) {
    (void)m;
    memset(info, 0, sizeof *info);
}
void cuda_graphs_set(struct dsv4_model *m, int on, int drop_test) {
    (void)m; (void)on; (void)drop_test;
}
int cuda_trace_begin(cuda_kernel_trace **t, dsv4_error *err) {
    *t = NULL;
    return no_cuda(err);
}
int cuda_trace_end(cuda_kernel_trace *t, dsv4_error *err) {
    (void)t;
    return no_cuda(err);
}
size_t cuda_trace_spans(const cuda_kernel_trace *t, const cuda_kernel_span **spans) {
    (void)t;
    *spans = NULL;
    return 0;
}
void cuda_trace_free(cuda_kernel_trace *t) { (void)t; }
#else
typedef int dsv4_cuda_stub_unused; /* ISO C wants a translation unit to declare something */
#endif
