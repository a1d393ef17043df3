/* CUDA graphs of the step (cu_graph.cu), as C calls for cuda_step.c.
 *
 * The step's launch sequence is captured from the model's stream (cudaStreamBeginCapture, thread-local mode)
 * in segments of a few layers each, and every segment is then run as one executable graph: the GPU sees one
 * launch per segment instead of ~55 per layer, and the host captures segment k + 1 while the GPU runs segment k.
 * The capture is made again on every step, so every kernel argument, grid and shared memory size is the one
 * the host code computes for this step (they change with the context length); only the executable graphs are
 * kept, in a few slots keyed by the step's shape, and brought up to date with cudaGraphExecUpdate (or
 * instantiated again when the update is refused, e.g. when a launch appeared or changed its kernel). A graph
 * runs the same kernels with the same arguments in the same order on the same stream as the direct launches,
 * so the bits are the same with graphs on and off. */
#ifndef DSV4_CU_GRAPH_H
#define DSV4_CU_GRAPH_H
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "dsv4.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cu_graphs cu_graphs;

/* What the graphs of a model have done so far (dsv4 bench, the GPU tests). */
typedef struct {
    long graphed_steps, direct_steps;   /* steps run as graphs / launched directly (kept by cuda_step.c) */
    long captures, instantiations, updates, launches;
    long programmatic_edges;            /* kernel -> kernel edges made programmatic, over all captures (cu_graph.cu) */
    long joins;                         /* nodes waiting on two or more others (branches joining), all captures */
    cuda_graph_host_ms host_ms;         /* the host's time in graphed steps (cuda_backend.h) */
} cu_graph_counts;

/* NULL when out of memory. programmatic (CU_PDL_*): every kernel -> kernel edge of a captured graph becomes a
 * programmatic one, so a kernel's launch overlaps the end of the one before it (cu_graph.cu's head; the same bits
 * any way), from the upstream kernel's launch completion or from its blocks' exit. */
enum { CU_PDL_OFF = 0, CU_PDL_LAUNCH = 1, CU_PDL_EXIT = 2 };
cu_graphs *cu_graphs_new(int programmatic);
void cu_graphs_free(cu_graphs *g);        /* NULL is fine; waits for nothing (a graph in flight is freed when it ends) */
cu_graph_counts *cu_graphs_counts(cu_graphs *g);
/* Test only (tests/gpu/test_gpu_graphs.c): on, every captured graph loses one kernel (a node without
 * dependents) before it is instantiated, so that the test can see its check fail. Clears the kept graphs. */
void cu_graphs_drop_test(cu_graphs *g, int on);

/* The slot for a step of T tokens in n_items items (and `variant`, what else changes its launches) run as
 * `segments` graphs: the slot of that shape, or else an empty one, or else the least recently used one (whose
 * graphs are kept as candidates for an update). -1 when out of memory. The shape only picks the graphs most
 * likely to take an update: any slot gives the same results. */
int  cu_graphs_slot(cu_graphs *g, int T, int n_items, int variant, int segments);

/* DIAG_REPLAY only (cuda_step.c; a measuring build whose results are wrong): launch the slot's executable graph of
 * segment seg as it was last captured, with no capture. -1 when there is none. */
int  cu_graph_relaunch(cu_graphs *g, int slot, int seg, cu_stream st);
/* Begin capturing st (nothing runs until cu_graph_end). 0, or a one-line error and st is not capturing. */
int  cu_graph_begin(cu_graphs *g, cu_stream st, dsv4_error *err);
/* End the capture begun on st. discard: drop what was captured and return 0 (the caller has its own error).
 * Else update slot's graph of segment seg with it (or instantiate it) and launch it on st: 0, or a one-line
 * error (a launch that failed during the capture included). Either way st is no longer capturing. */
int  cu_graph_end(cu_graphs *g, int slot, int seg, cu_stream st, int discard, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
