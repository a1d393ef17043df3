/* CUDA graphs of the step: capture, the kept executable graphs, update or instantiate, launch (cu_graph.h).
 *
 * Rules of stream capture this relies on (CUDA programming guide, "Stream Capture"; cudaStreamBeginCapture):
 *   - thread-local mode: only this thread is kept from calls that could synchronise implicitly (cudaMalloc,
 *     cudaMemcpy, cudaStreamSynchronize, ...). The step does every upload, allocation and wait outside the
 *     captured region (cuda_step.c); between begin and end only kernel launches on st and calls that are no
 *     stream operation (cudaFuncSetAttribute, cudaGetDevice, cudaDeviceGetAttribute, cudaGetLastError) are made.
 *   - a launch that fails during the capture is not in the graph: the error is read with cudaGetLastError right
 *     after the capture ends and the graph is thrown away, so a graph missing a kernel is never run.
 *   - cudaGraphExecUpdate changes the parameters of the nodes of an executable graph to those of a graph of the
 *     same topology; when it refuses (another node count, a kernel it cannot swap), the graph is instantiated
 *     again. A refused update and a failed instantiation leave their error in cudaGetLastError: cleared here,
 *     or the step's cu_finish would report it.
 * Programmatic edges (cu_graphs_new's `programmatic`): before a captured segment is instantiated, every edge from one
 * kernel node to another becomes a programmatic dependency (cudaGraphDependencyTypeProgrammatic) from one of the
 * upstream kernel's ports: CU_PDL_LAUNCH (cudaGraphKernelNodePortLaunchCompletion), the downstream kernel's blocks
 * may be launched once every block of the upstream one has begun; CU_PDL_EXIT (cudaGraphKernelNodePortProgrammatic
 * with no kernel calling griddepcontrol.launch_dependents), once every block of it has exited, before its memory
 * is flushed. Either way each downstream block first executes dev_grid_wait
 * (cu_common.cuh; tests/cli/pdl_wait.sh checks every kernel), which returns when the upstream grid has completed
 * and its memory operations are visible. So a kernel still starts its work after everything before it in the
 * stream, as with a plain edge (completion is transitive: the upstream kernel itself waited), and only the
 * launch latency between two kernels (~2-4 us each, ~25 kernels a layer) moves under the upstream kernel's run.
 * Edges to or from anything else (none today) stay plain.
 * Kernels with more than 48 KiB of dynamic shared memory have their attribute set to a value that never changes
 * (k_attention.cu: cu_attention's ATT_CHUNKED 0 kernel, the indexer's fixed size; the chunked attention kernels
 * use static shared memory only), so the attribute is large enough for every captured node whenever the driver
 * reads it. */
#include "backend/cuda/cu_graph.h"
extern "C" {
#include "core/profile.h"
#include "util/error.h"
}
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

/* Shapes kept at once (decode at one or two batch sizes, a verify step, a prefill chunk size, ...). */
#define CU_GRAPH_SLOTS 8

typedef struct {
    int T, items, variant, n_seg;   /* n_seg 0: empty */
    unsigned long long used;   /* the clock at the last step that used the slot */
    cudaGraphExec_t *exec;     /* [n_seg], NULL until the segment's first capture */
} graph_slot;

struct cu_graphs {
    graph_slot slot[CU_GRAPH_SLOTS];
    unsigned long long clock;
    int drop_test;
    int programmatic;   /* CU_PDL_*: kernel -> kernel edges made programmatic (above) */
    double t_begin;     /* ms, core/profile.c's clock, when the capture in progress began */
    cu_graph_counts n;
};

static void slot_clear(graph_slot *s) {
    for (int i = 0; i < s->n_seg; i++)
        if (s->exec[i]) cudaGraphExecDestroy(s->exec[i]);
    free(s->exec);
    memset(s, 0, sizeof *s);
}

extern "C" cu_graphs *cu_graphs_new(int programmatic) {
    cu_graphs *g = (cu_graphs *)calloc(1, sizeof(cu_graphs));
    if (g) g->programmatic = programmatic;
    return g;
}

extern "C" void cu_graphs_free(cu_graphs *g) {
    if (!g) return;
    for (int i = 0; i < CU_GRAPH_SLOTS; i++) slot_clear(&g->slot[i]);
    free(g);
}

extern "C" cu_graph_counts *cu_graphs_counts(cu_graphs *g) { return &g->n; }

extern "C" void cu_graphs_drop_test(cu_graphs *g, int on) {
    for (int i = 0; i < CU_GRAPH_SLOTS; i++) slot_clear(&g->slot[i]);
    g->drop_test = on;
}

extern "C" int cu_graphs_slot(cu_graphs *g, int T, int n_items, int variant, int segments) {
    int pick = -1;
    for (int i = 0; i < CU_GRAPH_SLOTS && pick < 0; i++)
        if (g->slot[i].n_seg == segments && g->slot[i].T == T && g->slot[i].items == n_items && g->slot[i].variant == variant)
            pick = i;
    for (int i = 0; i < CU_GRAPH_SLOTS && pick < 0; i++)
        if (!g->slot[i].n_seg) pick = i;
    if (pick < 0) {
        pick = 0;
        for (int i = 1; i < CU_GRAPH_SLOTS; i++)
            if (g->slot[i].used < g->slot[pick].used) pick = i;
    }
    graph_slot *s = &g->slot[pick];
    if (s->n_seg != segments) {
        slot_clear(s);
        if (!(s->exec = (cudaGraphExec_t *)calloc((size_t)segments, sizeof(cudaGraphExec_t)))) return -1;
        s->n_seg = segments;
    }
    s->T = T;
    s->items = n_items;
    s->variant = variant;
    s->used = ++g->clock;
    return pick;
}

extern "C" int cu_graph_relaunch(cu_graphs *g, int slot, int seg, cu_stream st) {
    cudaGraphExec_t x = g->slot[slot].exec ? g->slot[slot].exec[seg] : NULL;
    if (!x || cudaGraphLaunch(x, (cudaStream_t)st) != cudaSuccess) return -1;
    g->n.launches++;
    return 0;
}

extern "C" int cu_graph_begin(cu_graphs *g, cu_stream st, dsv4_error *err) {
    g->t_begin = cpu_profile_now_ms();
    const cudaError_t e = cudaStreamBeginCapture((cudaStream_t)st, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_fail(err, DSV4_E_STATE, "CUDA error beginning the capture of the step's graph: %s", cudaGetErrorString(e));
    }
    return 0;
}

/* Test only: remove one node that no other node waits for (the segment's last kernel on one stream). */
static void drop_one_leaf(cudaGraph_t graph) {
    size_t n = 0;
    if (cudaGraphGetNodes(graph, NULL, &n) != cudaSuccess || !n) return;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(sizeof(cudaGraphNode_t) * n);
    if (nodes && cudaGraphGetNodes(graph, nodes, &n) == cudaSuccess)
        for (size_t i = 0; i < n; i++) {
            size_t deps = 0;
            if (cudaGraphNodeGetDependentNodes(nodes[i], NULL, NULL, &deps) == cudaSuccess && deps == 0) {
                cudaGraphDestroyNode(nodes[i]);
                break;
            }
        }
    free(nodes);
    cudaGetLastError();
}

/* Nodes of graph with two or more dependencies: where branches of the step (cuda_step.c branch_fork) join. */
static long count_joins(cudaGraph_t graph) {
    size_t n = 0;
    long joins = 0;
    if (cudaGraphGetNodes(graph, NULL, &n) != cudaSuccess || !n) return 0;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(sizeof(cudaGraphNode_t) * n);
    if (nodes && cudaGraphGetNodes(graph, nodes, &n) == cudaSuccess)
        for (size_t i = 0; i < n; i++) {
            size_t deps = 0;
            if (cudaGraphNodeGetDependencies(nodes[i], NULL, NULL, &deps) == cudaSuccess && deps >= 2) joins++;
        }
    free(nodes);
    cudaGetLastError();
    return joins;
}

/* ms since *t on core/profile.c's clock; *t becomes now. */
static double since(double *t) {
    const double now = cpu_profile_now_ms(), d = now - *t;
    *t = now;
    return d;
}

static int is_kernel(cudaGraphNode_t node) {
    cudaGraphNodeType t;
    return cudaGraphNodeGetType(node, &t) == cudaSuccess && t == cudaGraphNodeTypeKernel;
}

/* Every plain kernel -> kernel edge of graph made programmatic (the file's head). Returns how many, or -1 when
 * the graph could not be read or changed: then it may hold a mix of both kinds of edge, each still correct. */
static long make_edges_programmatic(cudaGraph_t graph, int mode) {
    size_t n = 0;
    if (cudaGraphGetEdges(graph, NULL, NULL, NULL, &n) != cudaSuccess) return -1;
    if (!n) return 0;
    cudaGraphNode_t *from = (cudaGraphNode_t *)malloc(2 * n * sizeof(cudaGraphNode_t));
    cudaGraphEdgeData *data = (cudaGraphEdgeData *)malloc(n * sizeof(cudaGraphEdgeData));
    long made = 0;
    if (!from || !data || cudaGraphGetEdges(graph, from, from + n, data, &n) != cudaSuccess) made = -1;
    for (size_t i = 0; i < n && made >= 0; i++) {
        cudaGraphNode_t *to = from + n + i;
        if (data[i].type != cudaGraphDependencyTypeDefault || !is_kernel(from[i]) || !is_kernel(*to)) continue;
        cudaGraphEdgeData pdl;
        memset(&pdl, 0, sizeof pdl);
        pdl.type = cudaGraphDependencyTypeProgrammatic;
        pdl.from_port = mode == CU_PDL_LAUNCH ? cudaGraphKernelNodePortLaunchCompletion : cudaGraphKernelNodePortProgrammatic;
        if (cudaGraphRemoveDependencies(graph, &from[i], to, &data[i], 1) != cudaSuccess) made = -1;
        else if (cudaGraphAddDependencies(graph, &from[i], to, &pdl, 1) != cudaSuccess) {
            cudaGraphAddDependencies(graph, &from[i], to, &data[i], 1);   /* the plain edge back: never none */
            made = -1;
        } else made++;
    }
    free(from);
    free(data);
    return made;
}

extern "C" int cu_graph_end(cu_graphs *g, int slot, int seg, cu_stream st, int discard, dsv4_error *err) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)st, &graph);
    const cudaError_t during = cudaGetLastError();   /* a launch refused during the capture, or the end's own error */
    double t = cpu_profile_now_ms();
    g->n.host_ms.capture += t - g->t_begin;
    if (e == cudaSuccess) e = during;
    if (discard || e != cudaSuccess || !graph) {
        if (graph) cudaGraphDestroy(graph);
        if (discard) return 0;
        return dsv4_fail(err, DSV4_E_STATE, "CUDA error capturing the step's graph: %s",
                         cudaGetErrorString(e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated));
    }
    g->n.captures++;
    g->n.joins += count_joins(graph);
    if (g->drop_test) drop_one_leaf(graph);
    if (g->programmatic) {
        const long made = make_edges_programmatic(graph, g->programmatic);
        if (made < 0) {
            cudaGetLastError();
            cudaGraphDestroy(graph);
            return dsv4_fail(err, DSV4_E_STATE, "CUDA error making the step graph's edges programmatic");
        }
        g->n.programmatic_edges += made;
    }
    g->n.host_ms.edit += since(&t);
    cudaGraphExec_t *x = &g->slot[slot].exec[seg];
    if (*x) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(*x, graph, &info) == cudaSuccess) {
            g->n.updates++;
        } else {
            cudaGetLastError();
            cudaGraphExecDestroy(*x);
            *x = NULL;
        }
    }
    if (!*x) {
        e = cudaGraphInstantiate(x, graph, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            *x = NULL;
            cudaGraphDestroy(graph);
            return dsv4_fail(err, DSV4_E_STATE, "CUDA error instantiating the step's graph: %s", cudaGetErrorString(e));
        }
        g->n.instantiations++;
    }
    cudaGraphDestroy(graph);   /* the executable graph keeps what it needs */
    g->n.host_ms.update += since(&t);
    e = cudaGraphLaunch(*x, (cudaStream_t)st);
    g->n.host_ms.launch += since(&t);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return dsv4_fail(err, DSV4_E_STATE, "CUDA error launching the step's graph: %s", cudaGetErrorString(e));
    }
    g->n.launches++;
    return 0;
}
