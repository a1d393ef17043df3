/* tools/gpu/shim/cuda_shim.h: the fibers. */
#include "cuda_shim.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {
enum { RUNNING, AT_BLOCK, AT_WARP };   /* where a fiber waits: __syncthreads, or a warp-wide exchange */
struct fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done;
    int wait;
};
ucontext_t sched;
std::vector<fiber> fibers;
unsigned current;
const std::function<void()> *body;
std::vector<float> exchange;

void entry(void) {
    (*body)();
    fibers[current].done = true;
    swapcontext(&fibers[current].ctx, &sched);
}
}

void __syncthreads(void) {
    fibers[current].wait = AT_BLOCK;
    swapcontext(&fibers[current].ctx, &sched);
}

void shim_warp_sync(void) {
    fibers[current].wait = AT_WARP;
    swapcontext(&fibers[current].ctx, &sched);
}

/* m16n8k16 bf16 from the PTX ISA's fragment definitions (cuda_shim.h): every lane leaves its registers, the warp
 * meets, each lane computes its four elements from the whole warp's, the warp meets again before anyone reuses
 * the exchange. Each element is C + the 16 products summed in double, rounded to float once. */
namespace {
uint32_t xa[1024][4], xb[1024][2];
float bf16f(uint32_t h) { return __uint_as_float((h & 0xffffu) << 16); }
}
void shim_mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    const unsigned t = threadIdx.x, w0 = t & ~31u, lane = t & 31, g = lane >> 2, q = lane & 3;
    xa[t][0] = a0; xa[t][1] = a1; xa[t][2] = a2; xa[t][3] = a3;
    xb[t][0] = b0; xb[t][1] = b1;
    shim_warp_sync();
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; l++) {
        const unsigned lg = l >> 2, lq = l & 3;
        for (unsigned i = 0; i < 2; i++) {
            A[lg][2 * lq + i] = bf16f(xa[w0 + l][0] >> (16 * i));
            A[lg + 8][2 * lq + i] = bf16f(xa[w0 + l][1] >> (16 * i));
            A[lg][2 * lq + 8 + i] = bf16f(xa[w0 + l][2] >> (16 * i));
            A[lg + 8][2 * lq + 8 + i] = bf16f(xa[w0 + l][3] >> (16 * i));
            B[2 * lq + i][lg] = bf16f(xb[w0 + l][0] >> (16 * i));
            B[2 * lq + 8 + i][lg] = bf16f(xb[w0 + l][1] >> (16 * i));
        }
    }
    shim_warp_sync();
    const unsigned m[4] = { g, g, g + 8, g + 8 }, n[4] = { 2 * q, 2 * q + 1, 2 * q, 2 * q + 1 };
    for (int e = 0; e < 4; e++) {
        double s = d[e];
        for (int k = 0; k < 16; k++) s += (double)A[m[e]][k] * B[k][n[e]];
        d[e] = (float)s;
    }
}

float __shfl_xor_sync(unsigned mask, float v, int off) {
    (void)mask;
    __syncthreads();
    exchange[threadIdx.x] = v;
    __syncthreads();
    const float r = exchange[threadIdx.x ^ (unsigned)off];
    __syncthreads();
    return r;
}

void shim_poison(void *p, size_t n) { memset(p, 0xff, n); }

void shim_launch(dim3 grid, dim3 block, const std::function<void()> &f) {
    gridDim = grid;
    blockDim = block;
    body = &f;
    const unsigned n = block.x;
    if (n > 1024) {
        fprintf(stderr, "shim: blocks of %u threads (1024 at most)\n", n);
        abort();
    }
    fibers.resize(n);
    exchange.assign(n, 0.0f);
    for (auto &fb : fibers) fb.stack.resize(1 << 16);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                for (unsigned t = 0; t < n; t++) {
                    fiber &fb = fibers[t];
                    fb.done = false;
                    getcontext(&fb.ctx);
                    fb.ctx.uc_stack.ss_sp = fb.stack.data();
                    fb.ctx.uc_stack.ss_size = fb.stack.size();
                    fb.ctx.uc_link = nullptr;
                    makecontext(&fb.ctx, entry, 0);
                }
                /* Every running thread runs to its next barrier (or its end); then a warp all of whose live threads
                 * wait at a warp exchange goes on, else the block's barrier opens when every live thread waits at
                 * it. A block barrier that some threads skipped by returning is allowed only when all of them return
                 * (uniform exits); a warp exchange needs every thread of the warp. */
                unsigned ended_since_barrier = 0;
                for (auto &fb : fibers) fb.wait = RUNNING;
                for (;;) {
                    unsigned live = 0;
                    for (unsigned t = 0; t < n; t++) {
                        if (fibers[t].done || fibers[t].wait != RUNNING) continue;
                        current = t;
                        threadIdx = dim3(t, 0, 0);
                        swapcontext(&sched, &fibers[t].ctx);
                        if (fibers[t].done) ended_since_barrier++;
                    }
                    for (unsigned t = 0; t < n; t++) live += !fibers[t].done;
                    if (!live) break;
                    bool released = false;
                    for (unsigned w = 0; w < n; w += 32) {
                        unsigned at = 0, wl = 0, all = 0;
                        for (unsigned t = w; t < n && t < w + 32; t++) {
                            all++;
                            wl += !fibers[t].done;
                            at += !fibers[t].done && fibers[t].wait == AT_WARP;
                        }
                        if (at && at == wl) {
                            if (wl != all) {
                                fprintf(stderr, "shim: block (%u,%u,%u): a warp exchange with %u of %u threads\n", x, y, z, wl, all);
                                abort();
                            }
                            for (unsigned t = w; t < w + all; t++) fibers[t].wait = RUNNING;
                            released = true;
                        }
                    }
                    if (released) continue;
                    unsigned at_block = 0;
                    for (unsigned t = 0; t < n; t++) at_block += !fibers[t].done && fibers[t].wait == AT_BLOCK;
                    if (at_block != live) {
                        fprintf(stderr, "shim: block (%u,%u,%u): deadlock (%u threads at the block barrier, %u live)\n", x, y, z, at_block,
                                live);
                        abort();
                    }
                    if (ended_since_barrier) {
                        fprintf(stderr, "shim: block (%u,%u,%u): %u threads ended while %u wait at a barrier\n", x, y, z,
                                ended_since_barrier, live);
                        abort();
                    }
                    for (auto &fb : fibers) fb.wait = RUNNING;
                }
            }
}
