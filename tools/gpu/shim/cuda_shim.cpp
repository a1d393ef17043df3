/* tools/gpu/shim/cuda_shim.h: the fibers and their barriers. */
#include "cuda_shim.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {
struct fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done;
};
struct warp_state {
    unsigned count, gen;
    uint64_t slot[32], result[32];
};
ucontext_t sched;
std::vector<fiber> fibers;
std::vector<warp_state> warps;
unsigned current, n_threads, bar_count, bar_gen;
unsigned long progress;   /* arrivals at barriers and ends: a round without any is a deadlock */
const std::function<void()> *body;

void entry(void) {
    (*body)();
    fibers[current].done = true;
    swapcontext(&fibers[current].ctx, &sched);
}

void yield_now(void) { swapcontext(&fibers[current].ctx, &sched); }
}

void __syncthreads(void) {
    const unsigned gen = bar_gen;
    progress++;
    if (++bar_count == n_threads) {
        bar_count = 0;
        bar_gen++;
    }
    while (bar_gen == gen) yield_now();
}

const uint64_t *shim_warp_exchange(uint64_t v) {
    warp_state &w = warps[threadIdx.x >> 5];
    const unsigned first = threadIdx.x & ~31u, lanes = n_threads - first < 32 ? n_threads - first : 32;
    const unsigned gen = w.gen;
    w.slot[threadIdx.x & 31u] = v;
    progress++;
    if (++w.count == lanes) {
        w.count = 0;
        memcpy(w.result, w.slot, sizeof w.slot);
        w.gen++;
    }
    while (w.gen == gen) yield_now();
    return w.result;
}

void shim_poison(void *p, size_t n) { memset(p, 0xff, n); }

void shim_launch(dim3 grid, dim3 block, const std::function<void()> &f) {
    gridDim = grid;
    blockDim = block;
    body = &f;
    const unsigned n = block.x;
    n_threads = n;
    fibers.resize(n);
    warps.resize((n + 31) / 32);
    for (auto &fb : fibers) fb.stack.resize(1 << 16);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                bar_count = bar_gen = 0;
                for (auto &w : warps) w.count = w.gen = 0;
                for (unsigned t = 0; t < n; t++) {
                    fiber &fb = fibers[t];
                    fb.done = false;
                    getcontext(&fb.ctx);
                    fb.ctx.uc_stack.ss_sp = fb.stack.data();
                    fb.ctx.uc_stack.ss_size = fb.stack.size();
                    fb.ctx.uc_link = nullptr;
                    makecontext(&fb.ctx, entry, 0);
                }
                /* rounds: every live thread runs until it waits (or ends); a round in which no thread arrives
                 * anywhere or ends cannot be followed by one that does */
                for (;;) {
                    unsigned live = 0, ended = 0;
                    const unsigned long before = progress;
                    for (unsigned t = 0; t < n; t++) {
                        if (fibers[t].done) {
                            ended++;
                            continue;
                        }
                        current = t;
                        threadIdx = dim3(t, 0, 0);
                        swapcontext(&sched, &fibers[t].ctx);
                        if (fibers[t].done) {
                            ended++;
                            progress++;
                        } else
                            live++;
                    }
                    if (!live) break;
                    if (progress == before) {
                        fprintf(stderr, "shim: block (%u,%u,%u): %u threads wait at a barrier or warp intrinsic that cannot complete "
                                        "(%u threads ended)\n", x, y, z, live, ended);
                        abort();
                    }
                }
            }
}
