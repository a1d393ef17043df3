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
unsigned named_count[16], named_gen[16];   /* bar.sync 1..15 */
unsigned long progress;   /* arrivals at barriers and ends: a round without any is a deadlock */
unsigned long block_serial;   /* blocks started since the process began */
const std::function<void()> *body;

void entry(void) {
    (*body)();
    fibers[current].done = true;
    swapcontext(&fibers[current].ctx, &sched);
}

void yield_now(void) { swapcontext(&fibers[current].ctx, &sched); }
}

unsigned long shim_block_serial(void) { return block_serial; }

void __syncthreads(void) {
    const unsigned gen = bar_gen;
    progress++;
    if (++bar_count == n_threads) {
        bar_count = 0;
        bar_gen++;
    }
    while (bar_gen == gen) yield_now();
}

/* The predicate's AND over the block, returned to every thread: the round's first arrival starts the AND, the
 * last one publishes it before the generation moves on (fibers switch only inside barriers). */
int __syncthreads_and(int p) {
    static int acc, result;
    const unsigned gen = bar_gen;
    progress++;
    if (bar_count == 0) acc = 1;
    acc &= p != 0;
    if (++bar_count == n_threads) {
        bar_count = 0;
        result = acc;
        bar_gen++;
    }
    while (bar_gen == gen) yield_now();
    return result;
}

void shim_bar_sync(unsigned id, unsigned n) {
    if (id == 0 || id > 15 || n == 0 || n % 32 || n > n_threads) {
        fprintf(stderr, "shim: bar.sync %u, %u: a bad barrier for a block of %u threads\n", id, n, n_threads);
        abort();
    }
    if (threadIdx.x >= n) {   /* not the hardware's rule (any n threads), but the kernels' use: the first n */
        fprintf(stderr, "shim: thread %u at bar.sync %u, %u\n", threadIdx.x, id, n);
        abort();
    }
    const unsigned gen = named_gen[id];
    progress++;
    if (++named_count[id] == n) {
        named_count[id] = 0;
        named_gen[id]++;
    }
    while (named_gen[id] == gen) yield_now();
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

namespace {
struct mma_regs {
    uint32_t a[4], b[2];
    float c[4];
};
std::vector<mma_regs> mma_x;

float bf16_lo(uint32_t r) { return __uint_as_float(r << 16); }
float bf16_hi(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }
/* element k (0..15) of a register pair holding k = 2qd, 2qd+1 (first) and 2qd+8, 2qd+9 (second) */
float frag_k(const uint32_t *lo_reg, const uint32_t *hi_reg, int k) {
    const uint32_t r = k < 8 ? *lo_reg : *hi_reg;
    return k & 1 ? bf16_hi(r) : bf16_lo(r);
}
}

void shim_mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    const unsigned me = threadIdx.x, base = me & ~31u, lane = me & 31u, g = lane >> 2, qd = lane & 3;
    mma_x.resize(blockDim.x);
    mma_x[me] = { { a0, a1, a2, a3 }, { b0, b1 }, { d[0], d[1], d[2], d[3] } };
    shim_warp_exchange(0);   /* a meeting of this warp only: the other warps may run other MMAs or have ended */
    float out[4];
    for (int e = 0; e < 4; e++) {
        const unsigned m = g + 8 * (e >> 1), n = 2 * qd + (e & 1);
        /* C[m][n]: lane 4 (m mod 8) + n / 2, register (n & 1) + 2 (m >= 8) */
        double acc = mma_x[base + 4 * (m & 7) + n / 2].c[(n & 1) + 2 * (m >= 8)];
        for (int k = 0; k < 16; k++) {
            /* A[m][k]: lane 4 (m mod 8) + (k mod 8) / 2, register (m >= 8) + 2 (k >= 8), half k & 1 */
            const mma_regs &ra = mma_x[base + 4 * (m & 7) + (k & 7) / 2];
            const float a = frag_k(&ra.a[m >= 8], &ra.a[2 + (m >= 8)], k);
            /* B[k][n]: lane 4 n + (k mod 8) / 2, register k >= 8, half k & 1 */
            const mma_regs &rb = mma_x[base + 4 * n + (k & 7) / 2];
            const float b = frag_k(&rb.b[0], &rb.b[1], k);
            acc += (double)(a * b);   /* exact in fp32 */
        }
        out[e] = (float)acc;
    }
    shim_warp_exchange(0);   /* every lane read the registers before any writes its next ones */
    for (int e = 0; e < 4; e++) d[e] = out[e];
}

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
                block_serial++;
                bar_count = bar_gen = 0;
                memset(named_count, 0, sizeof named_count);
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
