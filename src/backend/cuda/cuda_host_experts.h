/* Routed experts in host memory (issue 15, docs/HOST_EXPERTS.md). Private to src/backend/cuda/.
 *
 * When the weights do not all fit in the GPU budget, model/expert_place.h chooses which routed experts of the main
 * layers stay in host memory; their device entries keep data NULL, so the GPU's expert tiles write their pair rows
 * as -0.0f (as for an expert another GPU holds). One MoE layer of a step with host experts (cuda_step.c step_moe):
 *   1. the GPU routes; the layer's normalised rows xn [T][dim] and the routing [T][K] are copied to page-locked
 *      host memory and an event is recorded behind them;
 *   2. the GPU goes on with its own experts and the shared expert, while the host thread waits for the event and
 *      computes the host experts' pair rows with the CPU kernels (core/moe.h moe_host_rows, the CPU step's expert
 *      in the model's numeric mode, on the model's thread pool), packed, with each row's pair index;
 *   3. the packed rows and their indices go to the GPU and a scatter puts each row at its pair index in ey, over
 *      the -0.0f the GPU wrote there; then the combine sums every token's pairs in increasing expert id, as always.
 * Pair indices are a function of the routing alone (moe_pair_offsets = the GPU plan's numbering), and each row
 * is computed from the same inputs whatever the batch: so the step stays deterministic and batch-invariant, and
 * differs from an all-GPU step only by the CPU and GPU expert kernels' difference (per-kernel tolerance).
 *
 * The bus share (expert_place.h expert_map_split_bus, `--bus-share`): some of the experts in host memory are read by
 * the GPU itself. Their bytes live in page-locked, mapped host memory (the bus arena) and their device entries point
 * there, so the GPU's expert kernels of step 2 read them over PCIe as they run, beside the host computing the
 * others: the host's cores and the bus each move part of a layer's host bytes. Such an expert's rows are the GPU
 * kernels' rows, bit for bit those of an all-GPU run (with every host expert on the bus, the step is the all-GPU
 * step). Packed FP4 experts (DSV4_CUDA_EXPERT_PACK) are packed in place in the bus arena at load.
 *
 * The token split (`--bus-by-token`, model/expert_split.h): every expert in host memory is EXPERT_ON_SPLIT, its bytes
 * in the bus arena (huge pages registered with CUDA: the host reads them too, so unpacked), and a rule on each token's
 * own routing row sends some of its routes to them over the bus and the rest to the host. The host computes its pairs
 * in step 2; the GPU's plan marks each split expert's tile without a bus pair absent (cu_moe_split_tiles), computes
 * the others whole, and the host's rows overwrite its pairs in step 3.
 *
 * A step enqueued ahead (cuda_step.c: steps of at most CU_HX_AHEAD_MAX_T tokens, as CUDA graphs or, with graphs off,
 * launched directly; DSV4_CUDA_HX_AHEAD, on by default since run 187: the hand-off in 16-byte bus reads (run 184) and
 * a core left to the enqueue (run 186) made it faster than the direct path):
 * the three steps above need the host in the middle of every such layer, and launched directly the step's
 * thread issues a layer's launches only once the host has answered the layer before, so every launch between two
 * hand-offs lies on the token's critical path (11-15 ms a token at --gpu-mem 80, runs 118-133). Instead both ends
 * of a hand-off are kernels, so the whole step is enqueued (captured, launched) first:
 *   1. k_hx_publish copies the layer's xn and routing into the page-locked mapped buffers and raises
 *      link->published to L + 1;
 *   2. a thread of its own, started before the enqueue (the server, cuda_hx_serve_start), serves the layers in
 *      order: it waits for published, computes the rows as in step 2 above into the mapped rows_h / pair_h, writes
 *      link->n and raises link->ready;
 *   3. k_hx_await_rows, where the layer's scatter stood, waits on the GPU for ready and scatters the rows, read over
 *      the bus from the mapped buffers.
 * Why a thread of its own: the GPU stops at the step's first hand-off until the host answers, while the step's thread
 * may still be capturing, instantiating and launching later segments — and some of those calls can wait for the
 * device (runs 177-178: served by the step's thread after its enqueue, the first hand-off of some steps went
 * unanswered for 60 s, while the host's serving began only once the GPU had given up). The server makes no CUDA
 * call before the enqueue has ended (cudaStreamQuery on a stream being captured would break the capture); after it,
 * it also watches the stream, so a CUDA error ends its wait. The step's thread joins it (cuda_hx_serve_finish).
 * Each layer's buffers are free again before the next layer's publish (its await comes first in the stream), so one
 * set serves the step. The same rows reach the same pair indices: the bits of the direct path (test_gpu_host_experts:
 * one-token steps enqueued ahead against the one-shot step launched directly, by memcmp). */
#ifndef DSV4_CUDA_HOST_EXPERTS_H
#define DSV4_CUDA_HOST_EXPERTS_H
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_runtime.h"
#include "core/moe.h"
#include "model/expert_place.h"
#include "model/safetensors.h"
#include <pthread.h>

struct dsv4_model;

#define CU_HX_AHEAD_MAX_T 64   /* the largest step enqueued ahead: its rows_h, T K dim floats, read over the bus */
/* The server's stream query while it waits for a routing (cuda_host_experts.c wait_published): at most this often. */
#ifndef CU_HX_STREAM_POLL_US
#define CU_HX_STREAM_POLL_US 1000
#endif
/* The model's pool workers spin this long for the next job before sleeping (dsv4_pool_set_spin) when the host computes
 * experts (cuda_model.c): its loops come one GPU stretch apart (the layer's end, the next attention and router:
 * ~0.15-0.5 ms), more than the pool's default 200 us, and a sleeping worker woke ~17-30 us late every layer (run 180);
 * spinning, 1-2 us. Decode at --gpu-mem 72 on an H100, launched directly: 28.9 -> 30.5 tok/s in run 181. In a step
 * enqueued ahead only with the pool one thread narrower (CU_HX_SPARE_MIN): with every core in the loops the spinning
 * workers and the enqueue took turns on the cores, and each loop waited for a descheduled worker (run 185: 29.8 ->
 * 23.2 tok/s; one narrower and spinning, 34.1 / 34.6 against 32.3 directly in run 186). */
#ifndef CU_HX_POOL_SPIN_US
#define CU_HX_POOL_SPIN_US 1000
#endif
/* A step enqueued ahead computes the host's experts on all but one of the pool's threads when it has at least this
 * many (dsv4_pool_set_width): the step's own thread captures and launches its graphs meanwhile (~5 ms a token at
 * Flash's 43 layers) and needs a core. */
#define CU_HX_SPARE_MIN 4

typedef struct cu_host_experts {
    expert_map map;            /* which experts of which main layer the host holds (EXPERT_ON_HOST, EXPERT_ON_BUS) */
    uint8_t *bus_shared;       /* [n_layers][n_routed]: 1 = a synthetic bus expert sharing another's bytes (packed once) */
    int *n_host;               /* [n_layers] experts the host computes per layer (a layer with none skips steps 1-3) */
    int bus_pct;               /* the bus share the map was split at (percent) */
    int T_cap;
    moe_host_scratch scr;
    float *xn_h, *route_w_h, *rows_h;   /* page-locked and mapped: [T][dim], [T][K], [T*K][dim] */
    int32_t *route_e_h, *pair_h;        /* page-locked and mapped: [T][K], [T*K] */
    cu_hx_link *link;          /* page-locked and mapped: a step enqueued ahead's hand-off words (cu_kernels.h) */
    unsigned *blocks_done;     /* device, 4 words at 0: k_hx_publish's block counter, then k_hx_await_rows' relay */
    int *ahead_layers, n_ahead;   /* the main layers a step enqueued ahead hands off, in order: those with n_host (at init) */
    int n_published;           /* of them, how many the enqueue has published so far (each must be the next listed) */
    int fail_at;               /* tests (cuda_hx_fail_next): the next served step fails at this hand-off; -1 none */
    /* the server of a step enqueued ahead (cuda_hx_serve_start): its thread, what it serves, what it found */
    pthread_t server;
    struct dsv4_model *serve_m;
    cu_stream serve_st;
    int serve_T, serving;      /* serving: the thread runs (joined by cuda_hx_serve_finish) */
    int serve_width;           /* the pool's width before the step (its loops leave a core to the enqueue meanwhile) */
    int enqueued;              /* atomic: the step's launches have ended, the server may query the stream */
    int cancel;                /* atomic: the step's thread gives up; the server stops at its next wait */
    int served_rc;             /* the server's result, its message in served_err */
    dsv4_error served_err;
    double t_begin, t_enqueued, t_first;   /* ms: the step began; its launches ended; the first routing reached the host */
    float *rows_d;             /* device [T*K][dim] */
    int32_t *pair_d;           /* device [T*K] */
    cu_event fetched;          /* step 1's copies are done */
    double host_ms, wait_ms;   /* time the host spent computing, and waiting for step 1 (dsv4 bench) */
    uint64_t host_rows;        /* pair rows the host computed */
    long ahead_steps;          /* steps enqueued ahead (cuda_hx_serve_start) */
    uint64_t host_bytes;       /* weight bytes of the experts it computed, each once a layer's step (m->routed_bytes) */
    st_memory memory;          /* where their bytes live (model/safetensors.h): copy = arena, populate / map = the file */
    uint8_t *arena;            /* copy: the bytes of every expert the host computes, on huge pages (util/bigmem.h),
                                * owned; the bindings of those experts point into it */
    size_t arena_bytes;
    uint8_t *bus_arena;        /* the bus experts' and split experts' bytes, page-locked and mapped (the same pointer on
                                * the GPU), owned; their bindings, host and device, point into it. With split experts
                                * (map.n_split) huge pages registered with CUDA, else cu_malloc_mapped's */
    size_t bus_bytes;
    uint8_t *owner_d;          /* device [n_layers][n_routed]: map.owner, for the token split's tiles; NULL without split experts */
    int synth_distinct;        /* synthetic: host experts with bytes of their own (the rest share them in a cycle) */
    size_t synth_bytes;        /* synthetic: the distinct host expert bytes (both arenas) */
} cu_host_experts;

/* Take the map (ownership moves to hx; map is cleared) and the per-layer counts. */
int  cuda_hx_init(cu_host_experts *hx, expert_map *map, dsv4_error *err);
/* A real checkpoint: where the host experts' bytes live. Those the host computes: by st_memory_choose on their
 * size (DSV4_WEIGHT_MEMORY), by default copied into one arena on huge pages, filled by the model's threads, with
 * the experts' bindings moved there (the CPU streams them every token: on 4 KiB pages each 4 KiB costs a TLB miss,
 * util/bigmem.h); else the file mapping, populated or not. The bus experts: always copied into the bus arena. */
int  cuda_hx_place(cu_host_experts *hx, struct dsv4_model *m, dsv4_error *err);
/* A synthetic checkpoint (model/synthetic.h) has holes where its host experts' weights would be: give each host
 * expert weights of its own in host memory (an arena on huge pages, as cuda_hx_place copies real ones), random values in its formats as k_synth.cu makes them on the GPU
 * (FP8 exponents 5..8, any FP4 nibble, UE8M0 scales 2^-6), so that the host reads real bytes at real bandwidth.
 * m's bindings of those experts point at them until the model is freed. Past 60 % of the machine's memory, later
 * host experts share earlier ones' bytes in a cycle (synth_distinct says how many have their own). */
int  cuda_hx_fill_synthetic(cu_host_experts *hx, struct dsv4_model *m, dsv4_error *err);
/* Buffers for steps of T tokens (called before a step changes anything). */
int  cuda_hx_reserve(cu_host_experts *hx, const dsv4_config *c, int T, dsv4_error *err);
/* Step 1 for main layer L, enqueued on st. */
int  cuda_hx_fetch(cu_host_experts *hx, cu_stream st, const dsv4_config *c, const float *xn, const int32_t *route_e,
                   const float *route_w, int T);
/* Steps 2-3: wait for step 1, compute on the host, enqueue the copies and the scatter into ey on st. */
int  cuda_hx_compute(cu_host_experts *hx, struct dsv4_model *m, int L, cu_stream st, int T, float *ey, dsv4_error *err);
/* A step enqueued ahead (the header's comment), before its launches: the link zeroed and the server started on
 * ahead_layers (every main layer with host experts, in order: those step_moe publishes), for the calling step's model
 * m, a step of T tokens on st. An error (no thread) leaves nothing running. */
int  cuda_hx_serve_start(cu_host_experts *hx, struct dsv4_model *m, cu_stream st, int T, dsv4_error *err);
/* Its step 1 and step 3 for main layer L, enqueued on st (publish: after the routing; await: where
 * cuda_hx_compute's scatter stands). */
void cuda_hx_publish(cu_host_experts *hx, cu_stream st, const dsv4_config *c, const float *xn, const int32_t *route_e,
                     const float *route_w, int T, int L);
void cuda_hx_await(cu_host_experts *hx, cu_stream st, const dsv4_config *c, int T, int L, float *ey);
/* Once the whole step is enqueued (or its enqueue failed: give_up, an error code already reported, else 0): the
 * server joined. give_up stops it at its next wait; on a failure (give_up, the server's own, a published layer the
 * list did not expect) every waiting layer is released (link->ready past all of them) and st drained. Returns
 * give_up, or the failure's code with its message in err. */
int  cuda_hx_serve_finish(cu_host_experts *hx, cu_stream st, int give_up, dsv4_error *err);
/* After such a step has finished on st: an error when a GPU wait timed out (its results are void). */
int  cuda_hx_check(const cu_host_experts *hx, dsv4_error *err);
/* Whether some layer has experts the host computes (map.n_host counts the bus experts too): without any, every
 * host-memory expert is read over the bus, a step has no host work and runs as CUDA graphs (cuda_step.c). */
static inline int cuda_hx_hands_off(const cu_host_experts *hx) { return hx->map.n_host > hx->map.n_bus; }
/* A bus expert of main layer L whose bytes are its own (pack it); 0 for a synthetic one sharing another's. */
static inline int cuda_hx_bus_owns(const cu_host_experts *hx, int L, int e) {
    return !hx->bus_shared[(int64_t)L * hx->map.n_routed + e];
}
void cuda_hx_free(cu_host_experts *hx);
#endif
