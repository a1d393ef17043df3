#include "core/moe_experts.h"
#include "backend/cpu/amx.h"
#include "backend/cpu/pairs.h"
#include "backend/cpu/isa.h"
#include "core/numerics.h"
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static inline float siluf(float x) { return x / (1.0f + expf(-x)); }

float *moe_silu_bf16_table(void) {
    float *t = malloc(sizeof(float) * 65536);
    for (uint32_t b = 0; t && b < 65536; b++) {
        const uint32_t u = b << 16;
        float x;
        memcpy(&x, &u, sizeof x);
        t[b] = siluf(x);
    }
    return t;
}

static int bf16_exact(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0xffff) == 0;
}

/* Columns [i0, i1) of a call's gate / up rows, for each of its tokens: OFFICIAL rounds both to bf16; then
 * h = silu(min(g, lim)) * clamp(v, -lim, lim), times the token's routing weight (as the official code does,
 * before the down projection), rounded to bf16 and FP8-quantized per 128 columns, into g. Every step is per
 * element or per 128-column block, so i0 must be a multiple of 128 and i1 one too or I: then any cut of
 * [0, I) into such ranges gives the values of one pass over [0, I).
 * In OFFICIAL mode min(g, lim) is a bf16 value (g was rounded; lim is one, 10 in V4's config), so silu is read
 * from m->silu_bf16, the same function's value for each of the 65536 (an expf a column took ~6 % of a 128-token
 * prefill); a limit that is not a bf16 value takes the function. The comparisons are fminf / fmaxf's (a NaN g or v
 * gives the limit, as they do), written out: GCC calls libm for those. */
static void activation_cols(const struct dsv4_model *m, const moe_expert_call *c, int I, int i0, int i1) {
    const dsv4_mode mode = m->mode;
    const float lim = m->cfg.swiglu_limit;
    const float *silu = is_official(mode) && (lim <= 0.0f || bf16_exact(lim)) ? m->silu_bf16 : NULL;
    const int w = i1 - i0;
    for (int t = 0; t < c->n; t++) {
        float *g = c->g + (int64_t)t * I + i0, *v = c->v + (int64_t)t * I + i0;
        num_bf16(mode, g, w);
        num_bf16(mode, v, w);
        for (int i = 0; i < w; i++) {
            float gi = g[i], vi = v[i];
            if (lim > 0.0f) {
                gi = gi < lim ? gi : lim;
                vi = vi > -lim ? vi : -lim;
                vi = vi < lim ? vi : lim;
            }
            uint32_t bits;
            memcpy(&bits, &gi, sizeof bits);
            float h = (silu ? silu[bits >> 16] : siluf(gi)) * vi;
            if (c->weight) h *= c->weight[t];
            g[i] = h;
        }
        num_bf16(mode, g, w);
        if (is_official(mode)) act_quant_fp8_inplace(g, w, 128);
    }
}

void moe_expert_one(struct dsv4_model *m, const moe_expert_call *c) {
    const int d = m->cfg.dim, I = m->cfg.moe_inter, n = c->n;
    linear_bf16_in(m->dots, m->pool, c->w1, c->x, n, d, c->g, I);
    linear_bf16_in(m->dots, m->pool, c->w3, c->x, n, d, c->v, I);
    activation_cols(m, c, I, 0, I);
    linear_bf16_in(m->dots, m->pool, c->w2, c->g, n, I, c->y, d);
    num_bf16(m->mode, c->y, (long)n * d);
}

/* ---- grouped ------------------------------------------------------------------------------------------------
 * A phase (gate/up, then down) is a list of units: unit = (call, a run of output rows). The pool's threads take
 * units one at a time from a shared counter until none is left, so they finish together whatever the units cost
 * (calls differ in format, FP4 routed and FP8 shared, and in token count, and a core may be busy with another
 * process); which thread computes a unit changes no value. The calls' units are queued costliest call first, so
 * the cheap ones fill the end.
 *
 * A unit is a block of BLOCK rows, or a 1/split of one where a phase has few: a token's three host experts on 16
 * threads make 48 gate/up blocks, and a thread that takes a fourth while the others have none left holds the loop
 * for a block's whole time (runs 180-184: the workers busy 65-77 % of their loops' time). The activation of a
 * 128-column block reads all of its gate and up rows, so in a split gate/up phase it runs on the thread that
 * finishes the block's last piece (a count of the pieces left, one per block, acquire-release), as one pass over
 * the block: the same values as with whole blocks. */
enum { BLOCK = 128 };   /* = the FP8 block of the activation's quantization: a gate/up unit's rows stay in one */
enum { UNITS_PER_THREAD = 8 };   /* a phase of fewer units than this per thread splits its blocks (to 16 rows) */
enum { SPLIT_BLOCKS = 512 };     /* the most blocks a split gate/up phase counts pieces of */
_Static_assert(BLOCK % CPU_AMX_ROWS == 0, "a unit's rows are whole AMX row blocks");
enum { SPLIT_MAX = BLOCK / CPU_AMX_ROWS };   /* a piece is at least one AMX row block */
typedef struct {
    struct dsv4_model *m;
    const cpu_kernels *k;
    const moe_expert_call *calls;
    int n_calls, d, I;
    int down;                                /* 0: w1, w3 and the activation; 1: w2 */
    cpu_dots dots;                           /* the model's order of bf16-input linears (m->dots) */
    cpu_amx_tokens tok[MOE_GROUP_CALLS + 1]; /* with AMX: each call's phase input in the tiles' layout */
    cpu_pairs_tokens ptok[MOE_GROUP_CALLS + 1]; /* with the pair order: each call's phase input as bf16s */
    int order[MOE_GROUP_CALLS + 1];          /* the calls by decreasing cost of a unit */
    int first_unit[MOE_GROUP_CALLS + 2];     /* the units of call order[i]: first_unit[i] .. first_unit[i + 1] - 1 */
    int split;                               /* pieces a block (1: units are whole blocks) */
    atomic_int next;                         /* the next unit no thread has taken */
    atomic_int pieces_left[SPLIT_BLOCKS];    /* split gate/up: block b of call order[i] at [i * blocks + b] */
} group_job;

/* Estimated time of one output row of w over n tokens, in bytes read: the row is read (and decoded) once, and
 * each token costs cols FMAs, about cols/16 byte-times on a core streaming weights at a few GB/s. Only the
 * order units are taken in depends on it, never a value. */
static double row_cost(const dsv4_weight *w, int n) {
    const double bytes = (double)(weight_bytes(w) + weight_scale_bytes(w)) / (w->rows > 0 ? w->rows : 1);
    return bytes + (double)n * w->cols / 16.0;
}

static int phase_rows(const group_job *j) { return j->down ? j->d : j->I; }

static double unit_row_cost(const group_job *j, const moe_expert_call *c) {
    return j->down ? row_cost(c->w2, c->n) : row_cost(c->w1, c->n) + row_cost(c->w3, c->n);
}

/* Pieces a block: 1, or the fewest (up to SPLIT_MAX) that give the phase UNITS_PER_THREAD units a thread; 1 where
 * a gate/up phase's calls have more blocks than pieces_left counts. It moves no value (group_job's comment). */
static int phase_split(int n_blocks, int slots, int threads, int down) {
    int split = 1;
    if (!down && slots > SPLIT_BLOCKS) return 1;   /* (group_job's pieces_left: at decode a few calls use it) */
    while (split < SPLIT_MAX && n_blocks * split < UNITS_PER_THREAD * threads) split *= 2;
    return split;
}

/* The queue of this phase's units: calls by decreasing unit cost (a stable insertion sort of at most 65), each
 * call's pieces in increasing row; a call without tokens has none. */
static void plan_units(group_job *j) {
    double cost[MOE_GROUP_CALLS + 1];
    for (int c = 0; c < j->n_calls; c++) {
        cost[c] = unit_row_cost(j, &j->calls[c]);
        int i = c;
        for (; i > 0 && cost[j->order[i - 1]] < cost[c]; i--) j->order[i] = j->order[i - 1];
        j->order[i] = c;
    }
    const int rows = phase_rows(j), blocks = (rows + BLOCK - 1) / BLOCK;
    int n_blocks = 0;
    for (int c = 0; c < j->n_calls; c++) n_blocks += j->calls[c].n > 0 ? blocks : 0;
    j->split = phase_split(n_blocks, j->n_calls * blocks, dsv4_pool_width(j->m->pool), j->down);
    const int piece = BLOCK / j->split, pieces = (rows + piece - 1) / piece;
    j->first_unit[0] = 0;
    for (int i = 0; i < j->n_calls; i++) {
        const int busy = j->calls[j->order[i]].n > 0;
        j->first_unit[i + 1] = j->first_unit[i] + (busy ? pieces : 0);
        if (j->split > 1 && !j->down)
            for (int b = 0; b < blocks; b++) {
                const int r_end = (b + 1) * BLOCK < rows ? (b + 1) * BLOCK : rows;
                atomic_init(&j->pieces_left[i * blocks + b], busy ? (r_end - b * BLOCK + piece - 1) / piece : 0);
            }
    }
    atomic_init(&j->next, 0);
}

/* Rows [r0, r1) of y = w x over call ci's tokens, by the kernel linear_bf16_in would pick for w: the AMX
 * tiles or the pair order's rows when the model takes that order and w's format fits (the tokens then made at
 * the phase's start, unless that ran out of memory: cpu_linear_amx and cpu_linear_pairs also fall back to the
 * fp32 kernels then), else the pool's linear_rows. */
static void rows_of(const group_job *j, int ci, const dsv4_weight *w, const float *x, int ldx, float *y, int ldy,
                    int r0, int r1, int thread) {
    if (j->dots == CPU_DOTS_AMX && j->tok[ci].xv && cpu_amx_usable(w)) {
        cpu_amx_rows(w, &j->tok[ci], y, ldy, r0, r1, thread);
        return;
    }
    if (j->dots == CPU_DOTS_PAIRS && j->ptok[ci].xb && cpu_pairs_usable(w)) {
        cpu_pairs_job pj = { w, &j->ptok[ci], y, NULL, ldy };
        j->k->pairs_rows(&pj, r0, r1, thread);
        return;
    }
    cpu_linear_job lj = { w, x, y, NULL, j->calls[ci].n, ldx, ldy };
    j->k->linear_rows(&lj, r0, r1, thread);
}

/* Rows [r0, r1) of w1 and w3 for call ci's tokens (a whole block, or a piece of one: never across a block's
 * boundary), then the activation on the block's columns once the block is whole: at once for a whole block (left
 * NULL), else after its last piece (*left counts the block's pieces not yet done; the thread that counts it to zero
 * has seen the others' rows by the acquire-release count). */
static void gate_up_rows(const group_job *j, int ci, int r0, int r1, atomic_int *left, int thread) {
    const moe_expert_call *c = &j->calls[ci];
    rows_of(j, ci, c->w1, c->x, j->d, c->g, j->I, r0, r1, thread);
    rows_of(j, ci, c->w3, c->x, j->d, c->v, j->I, r0, r1, thread);
    if (left && atomic_fetch_sub_explicit(left, 1, memory_order_acq_rel) != 1) return;
    const int b0 = r0 / BLOCK * BLOCK, b1 = b0 + BLOCK < j->I ? b0 + BLOCK : j->I;
    activation_cols(j->m, c, j->I, b0, b1);
}

/* Rows [r0, r1) of w2 for call ci's tokens, rounded to bf16 in OFFICIAL mode. */
static void down_rows(const group_job *j, int ci, int r0, int r1, int thread) {
    const moe_expert_call *c = &j->calls[ci];
    rows_of(j, ci, c->w2, c->g, j->I, c->y, j->d, r0, r1, thread);
    for (int t = 0; t < c->n; t++) num_bf16(j->m->mode, c->y + (int64_t)t * j->d + r0, r1 - r0);
}

/* The pool's worker, run once by every thread (the job has one item per thread): units from the queue until
 * it is empty. A thread takes increasing unit numbers, so its place in the call order only moves forward. */
static void group_units(void *ctx, int begin, int end, int thread) {
    group_job *j = ctx;
    const int rows = phase_rows(j), n_units = j->first_unit[j->n_calls];
    const int piece = BLOCK / j->split, blocks = (rows + BLOCK - 1) / BLOCK;
    for (int i = 0;;) {
        const int u = atomic_fetch_add(&j->next, 1);
        if (u >= n_units) break;
        while (u >= j->first_unit[i + 1]) i++;
        const int c = j->order[i], r0 = (u - j->first_unit[i]) * piece, r1 = r0 + piece < rows ? r0 + piece : rows;
        if (j->down) down_rows(j, c, r0, r1, thread);
        else gate_up_rows(j, c, r0, r1, j->split > 1 ? &j->pieces_left[i * blocks + r0 / BLOCK] : NULL, thread);
    }
}

/* With AMX or the pair order: each call's input of this phase (x for w1 and w3, the activation for w2) in the
 * layout of its kernel. */
static void phase_tokens(group_job *j) {
    for (int c = 0; c < j->n_calls; c++) {
        const moe_expert_call *e = &j->calls[c];
        const float *x = j->down ? e->g : e->x;
        const int cols = j->down ? j->I : j->d;
        j->tok[c].xv = NULL;
        j->ptok[c].xb = NULL;
        j->ptok[c].range = NULL;
        if (e->n <= 0) continue;
        if (j->dots == CPU_DOTS_AMX) (void)cpu_amx_tokens_make(&j->tok[c], x, e->n, cols, cols);
        if (j->dots == CPU_DOTS_PAIRS) (void)cpu_pairs_tokens_make(&j->ptok[c], x, e->n, cols, cols);
    }
}

static void phase_tokens_free(group_job *j) {
    for (int c = 0; c < j->n_calls; c++) {
        if (j->dots == CPU_DOTS_AMX) cpu_amx_tokens_free(&j->tok[c]);
        if (j->dots == CPU_DOTS_PAIRS) cpu_pairs_tokens_free(&j->ptok[c]);
    }
}

void moe_experts_grouped(struct dsv4_model *m, const moe_expert_call *calls, int n_calls) {
    if (n_calls <= 0) return;
    group_job j;
    j.m = m;
    j.k = dsv4_pool_kernels(m->pool);
    j.calls = calls;
    j.n_calls = n_calls > MOE_GROUP_CALLS + 1 ? MOE_GROUP_CALLS + 1 : n_calls;   /* (callers never pass more) */
    j.d = m->cfg.dim;
    j.I = m->cfg.moe_inter;
    j.dots = m->dots;
    /* every w2 reads the whole activation of its call, so the down phase starts after the gate/up phase */
    for (j.down = 0; j.down <= 1; j.down++) {
        plan_units(&j);
        phase_tokens(&j);
        dsv4_pool_run(m->pool, dsv4_pool_width(m->pool), group_units, &j);
        phase_tokens_free(&j);
    }
}
