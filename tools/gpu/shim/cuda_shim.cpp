/* tools/gpu/shim/cuda_shim.h: the fibers. */
#include "cuda_shim.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {
struct fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done;
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

void __syncthreads(void) { swapcontext(&fibers[current].ctx, &sched); }

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
                /* rounds: every live thread runs to its next barrier (or its end); a barrier that some threads of
                 * the block skip by returning early is allowed only when all of them return (uniform exits) */
                for (;;) {
                    unsigned live = 0, ended = 0;
                    for (unsigned t = 0; t < n; t++) {
                        if (fibers[t].done) continue;
                        current = t;
                        threadIdx = dim3(t, 0, 0);
                        swapcontext(&sched, &fibers[t].ctx);
                        if (fibers[t].done) ended++;
                        else live++;
                    }
                    if (!live) break;
                    if (ended) {
                        fprintf(stderr, "shim: block (%u,%u,%u): %u threads ended while %u wait at a barrier\n", x, y, z, ended, live);
                        abort();
                    }
                }
            }
}
