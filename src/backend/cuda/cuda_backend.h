/* The CUDA backend as the rest of the engine sees it (DESIGN §8). Four calls: is there a GPU, upload a loaded
 * model's weights, run one step, release. Everything else — kernels, device memory, the step's launch
 * sequence — is private to src/backend/cuda/. A build without CUDA (plain `make`) links cuda_stub.c instead,
 * whose calls fail with one clear line. */
#ifndef DSV4_BACKEND_CUDA_H
#define DSV4_BACKEND_CUDA_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct dsv4_model;

/* 1 when this build has the backend and device `gpu` is usable; else 0 and the reason in why. */
int  cuda_available(int gpu, dsv4_error *why);
/* Where a model's weights go. */
typedef struct {
    int gpu, n_gpus;
    uint64_t gpu_mem;           /* bytes of GPU memory for the weights; 0 = what is free less a working margin */
    const uint64_t *profile;    /* [n_layers][n_routed] routing counts (model/expert_profile.h), or NULL */
    int bus_pct;                /* of the experts in host memory, the percent the GPU reads over the bus and computes
                                 * (model/expert_place.h expert_map_split_bus), or EXPERT_BUS_AUTO */
    int split_pct;              /* >= 0: the token split instead (expert_map_split_tokens): of each token's routes to
                                 * experts in host memory, this percent over the bus; -1: off */
} cuda_placement;

/* Upload every weight of m (in its checkpoint format) to GPU p->gpu and make new sequences of m keep their state
 * there (m->cuda, m->state_mem). n_gpus > 1 spreads the routed experts of the main layers over GPUs gpu ..
 * gpu + n_gpus - 1 (expert parallelism, cuda_ep.h; NCCL loaded at run time). When the weights need more than
 * the budget, routed experts of the main layers stay in host memory and the host computes them
 * (cuda_host_experts.h; which ones: model/expert_place.h). Says how many bytes each GPU needs before allocating;
 * on any error nothing stays allocated and m is unchanged. */
int  cuda_model_init(struct dsv4_model *m, const cuda_placement *p, dsv4_error *err);
/* What the host has done for a model with experts in host memory, since it was loaded: its time computing them and
 * waiting for the GPU's routing (ms), and the weight bytes its expert kernels read (each host expert a layer's step
 * routes to, counted once a step: model/footprint.h). Over host_ms they are the host's read bandwidth while it runs.
 * ahead_steps: the steps enqueued ahead (cuda_host_experts.h; the rest with host work were launched directly). */
typedef struct {
    double host_ms, wait_ms;
    uint64_t host_bytes;
    long ahead_steps;
} cuda_host_work;
/* Routed experts of the main layers in host memory (0: all on the GPUs); *w (may be NULL) what the host did. */
int64_t cuda_host_experts(const struct dsv4_model *m, cuda_host_work *w);
/* Of those, the ones the GPU computes, reading their weights from host memory over the bus (0: none). */
int64_t cuda_bus_experts(const struct dsv4_model *m);
/* Of those, the ones split by token (--bus-by-token: either side computes a pair, model/expert_split.h; 0: none). */
int64_t cuda_split_experts(const struct dsv4_model *m);
/* For the GPU tests: the next step enqueued ahead (cuda_host_experts.h) fails in the host's turn at its k-th hand-off
 * (k >= 0; -1: none), as a host failure would, with the GPU waiting for that layer and the ones after. */
void cuda_hx_fail_next(struct dsv4_model *m, int k);
/* Where each routed expert of the main layers is computed: [n_layers][n_routed] owner values (model/expert_place.h
 * EXPERT_ON_*), or NULL when every expert is in GPU memory. Owned by the model. */
const uint8_t *cuda_expert_owners(const struct dsv4_model *m);
/* Count routes on the GPU (model/route_count.h): start from zero (on) or stop; read the counts [L][E]. */
int  cuda_count_routes(struct dsv4_model *m, int on, dsv4_error *err);
int  cuda_route_counts(const struct dsv4_model *m, uint64_t *counts, dsv4_error *err);
void cuda_model_free(struct dsv4_model *m);
/* dsv4_step on the GPU: the same validation and errors as the CPU step, then the whole forward on the device. */
int  cuda_step(struct dsv4_model *m, dsv4_step_item *items, int n_items, dsv4_error *err);

/* The V4 MTP head on the GPU (core/mtp.h dsv4_mtp_forward, which calls this for a cuda model): X is on the
 * host, [n][hc*dim]; the MTP state is a sequence of the model (its state on the GPU). */
int  cuda_mtp_forward(struct dsv4_model *m, dsv4_seq *state, const float *X, const int32_t *next_tokens, int n,
                      dsv4_logits_want want, float *logits, dsv4_error *err);

/* The DSpark drafter on the GPU (core/dspark.c calls these for a cuda model): its context ring ([n_stages]
 * [window][head_dim] fp32) lives in GPU memory (the model's state memory); commit adds positions pos.. from host features [n][n_targets*dim];
 * block runs the drafting block for ids [gamma] at pos and returns y [gamma][dim] and U [gamma][vocab] on the
 * host. */
int  cuda_dspark_commit(struct dsv4_model *m, float *ring, int64_t pos, const float *features, int n, dsv4_error *err);
int  cuda_dspark_block(struct dsv4_model *m, const float *ring, int64_t pos, const int32_t *ids, int gamma, float *y, float *U,
                       dsv4_error *err);
/* A whole draft on the GPU (core/dspark.h dsv4_dspark_draft): the block for ids, then the Markov correction, the
 * draw (draw numbers draw0 ..) and the confidence logit of rows 0 .. k-1 in turn; draft [k] and conf [k] come back,
 * and probs [k][vocab] (the drafting distributions) and U [k][vocab] (the corrected rows) when not NULL. */
int  cuda_dspark_draft(struct dsv4_model *m, const float *ring, int64_t pos, const int32_t *ids, int gamma, int k,
                       const dsv4_sampling *sp, uint64_t draw0, int32_t *draft, float *conf, float *probs, float *U, dsv4_error *err);

/* Per-stage timing of the CUDA step (dsv4 bench --profile): with it on, every stage boundary waits for the GPU
 * and adds the host time since the last boundary to its stage; off costs nothing. Print the totals with
 * cuda_profile_report. Both are no-ops without the backend. */
void cuda_profile(struct dsv4_model *m, int on);
/* The GPU's measured device-to-device copy bandwidth in GB/s (read + write), or -1 (no backend / failure). */
double cuda_copy_bandwidth_gbs(const struct dsv4_model *m);
void cuda_profile_report(const struct dsv4_model *m, void *file /* FILE * */);
/* CUDA graphs (cuda_step.c, cu_graph.h): a model's steps run as captured graphs unless DSV4_CUDA_GRAPHS=0 was
 * set when it was loaded; steps with experts in host memory or on several GPUs, or under the profiler, are
 * launched directly all the same. cuda_graphs_get says whether they are on and what they have done so far (all
 * zero without the backend). cuda_graphs_set turns them on or off for one model (the GPU tests compare both in
 * one process); drop_test, for tests/gpu/test_gpu_graphs.c only, removes one kernel from every captured graph so
 * that the test can see its check fail. Internal (no DSV4_API). */
/* The host's time in graphed steps, ms summed over all of them (dsv4 bench's "host a graphed decode step"): the
 * launch sequence captured (the step's own host code included), the captured graphs read and edited (joins
 * counted, edges made programmatic), brought up to date or instantiated, launched (cu_graph.cu); and each step
 * from its first capture to its last launch, then its wait for the GPU and the results (cuda_step.c). A step whose
 * wait is short ended on the host: the GPU waited for its launches. */
typedef struct {
    double capture, edit, update, launch, submit, wait;
} cuda_graph_host_ms;
typedef struct {
    int on;
    long graphed_steps, direct_steps;          /* main-model steps run as graphs / launched directly */
    long captures, instantiations, updates, launches;
    long programmatic_edges;                   /* kernel -> kernel edges made programmatic (DSV4_CUDA_PDL), all captures */
    long joins;                                /* graph nodes where branches join (DSV4_CUDA_BRANCH), all captures */
    cuda_graph_host_ms host_ms;                /* host time in graphed steps */
} cuda_graph_info;
void cuda_graphs_get(const struct dsv4_model *m, cuda_graph_info *info);
/* Whether OFFICIAL steps run the FP8/FP4 linears of act-quantized rows on tensor cores (k_mma.cu; DSV4_CUDA_MMA at
 * load, default on); 0 without the backend. */
int cuda_mma_on(const struct dsv4_model *m);
void cuda_graphs_set(struct dsv4_model *m, int on, int drop_test);
/* A kernel trace (cu_trace.c, `dsv4 bench --kernel-trace`): every kernel the GPU runs between begin and end,
 * graph nodes included, with its start and end (ns, the GPU's clock) as it ran, from CUPTI's activity records
 * (libcupti loaded at run time; a clear error where it is missing or another profiler holds it). One trace at a
 * time in a process. The spans come in the order CUPTI delivered them: sort them by start to read a timeline;
 * their names (the kernel's function, template arguments and parameters left out) stay valid until the trace is
 * freed. Without the backend, begin fails with one line. */
typedef struct {
    uint64_t start, end;
    const char *name;
} cuda_kernel_span;
typedef struct cuda_kernel_trace cuda_kernel_trace;
int    cuda_trace_begin(cuda_kernel_trace **t, dsv4_error *err);
int    cuda_trace_end(cuda_kernel_trace *t, dsv4_error *err);   /* flushes: every kernel that ran is in the trace */
size_t cuda_trace_spans(const cuda_kernel_trace *t, const cuda_kernel_span **spans);
void   cuda_trace_free(cuda_kernel_trace *t);                    /* NULL is fine; ends the trace if still open */
/* GPUs the model is spread over (0 without the backend) and the weight bytes GPU rank r holds. */
int      cuda_gpus(const struct dsv4_model *m);
/* Main layers with weights of their own (fewer than n_layers only for a synthetic model bigger than the GPUs). */
int      cuda_distinct_layers(const struct dsv4_model *m);
uint64_t cuda_gpu_weight_bytes(const struct dsv4_model *m, int r);

#ifdef __cplusplus
}
#endif
#endif
