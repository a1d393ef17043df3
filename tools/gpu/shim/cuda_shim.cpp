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
    __syncthreads();
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
    __syncthreads();   /* every lane read the registers before any writes its next ones */
    for (int e = 0; e < 4; e++) d[e] = out[e];
}

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
