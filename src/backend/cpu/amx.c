/* cpu_linear_amx (amx.h states the accumulation order). Built with AVX-512/AMX code generation whatever the
 * build's -march (Makefile): nothing in this file runs unless cpu_features() found AMX-BF16.
 *
 * Operands: AMX computes C[m][n] += sum_k A[m][k] * B[k][n] over one 32-column tile. A is 16 weight rows
 * decoded to bf16 (row-major, as the checkpoint stores them); B is the tokens in the "VNNI" layout, B row p
 * holding for each token the pair (x[2p], x[2p+1]); C is 16 rows x up to 16 tokens of fp32. Three token
 * groups (48 tokens) run per pass over a row block, each with its C tile. */
#include "backend/cpu/amx.h"
#include "backend/cpu/cpufeat.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "model/formats.h"
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { ROWS = 16, KTILE = 32, GROUP = 16, GROUPS = 3 };
enum { TILE_C0 = 0, TILE_A = 3, TILE_B0 = 4 };   /* C: tiles 0-2, A: 3, B: 4-6 */
/* With one token group (up to 16 tokens) tiles 5 and 6 are free: odd k-tiles load their A and B there, so
 * the loads of step k + 1 do not wait for step k's TDPBF16PS to finish reading tiles 3 and 4 (the loads had
 * been the stall of one-token linears); the steps on C stay the same, in the same order. */
enum { TILE_A_ODD = 5, TILE_B_ODD = 6 };

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

int cpu_amx_usable(const dsv4_weight *w) {
    return (cpu_features() & CPU_AMX_BF16) && (w->fmt == WF_BF16 || w->fmt == WF_FP8 || w->fmt == WF_FP4);
}

/* ---- weight rows -> bf16 (exact) ---- */

static inline uint16_t f32_bits_hi(float f) {   /* the bf16 of an f32 that is one (truncation = the value) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* Columns [c0, c0 + nc) of row `row` of w as bf16 into out[0..nc), zero at and beyond cols: the pair order's
 * exact decoders (isa/pairs.c's weight_row_bf16; the same bits in every set, so the best one). */
static void row_bf16(const dsv4_weight *w, int row, int c0, int nc, uint16_t *out, float *ftmp) {
    (void)cpu_kernels_best()->row_bf16(w, row, c0, nc, out, ftmp);
}

/* ---- the tiles ---- */

typedef struct {
    const dsv4_weight *w;
    const uint32_t *xv;   /* [n32/2][tpad]: token t's bf16 pair (x[2p], x[2p+1]) at xv[p*tpad + t] */
    int T, tpad, n32;
    float *y, *const *y_rows;
    int ldy;
} amx_job;

/* A per-thread scratch that grows (pool threads live as long as their pool; the key frees it at exit). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_key_make(void) { (void)pthread_key_create(&scratch_key, free); }
typedef struct { size_t cap; _Alignas(64) unsigned char data[]; } scratch_block;
static void *thread_scratch(size_t bytes) {
    pthread_once(&scratch_once, scratch_key_make);
    scratch_block *s = pthread_getspecific(scratch_key);
    if (s && s->cap >= bytes) return s->data;
    free(s);
    s = aligned_alloc(64, (sizeof *s + bytes + 63) / 64 * 64);
    if (s) s->cap = bytes;
    (void)pthread_setspecific(scratch_key, s);
    return s ? s->data : NULL;
}

static void configure(int widths[GROUPS], int ng) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[TILE_A] = ROWS;
    cfg.colsb[TILE_A] = KTILE * 2;
    for (int g = 0; g < ng; g++) {
        cfg.rows[TILE_C0 + g] = ROWS;
        cfg.colsb[TILE_C0 + g] = (uint16_t)(widths[g] * 4);
        cfg.rows[TILE_B0 + g] = KTILE / 2;
        cfg.colsb[TILE_B0 + g] = (uint16_t)(widths[g] * 4);
    }
    if (ng == 1) {
        cfg.rows[TILE_A_ODD] = ROWS;
        cfg.colsb[TILE_A_ODD] = KTILE * 2;
        cfg.rows[TILE_B_ODD] = KTILE / 2;
        cfg.colsb[TILE_B_ODD] = (uint16_t)(widths[0] * 4);
    }
    /* GCC's _tile_loadconfig reads the config through another struct type, so type-based alias analysis may
     * drop the field stores above when this is inlined (ldtilecfg then faults): a barrier keeps them */
    __asm__ __volatile__("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* A pass: one row block of 16 times the tokens [t0, t0 + 48), in up to three groups of 16 with a C tile each.
 * The A tile of k-tile kt is read at abuf + (kt - a_kt0) * KTILE, rows a_stride bytes apart: the decoded
 * block, or the decoded column chunk that holds kt. */
typedef struct { int r0, nr, t0, ng, widths[GROUPS]; const uint16_t *abuf; size_t a_stride; int a_kt0; } pass;

static pass pass_begin(const amx_job *j, const uint16_t *abuf, size_t a_stride, int r0, int t0, int *cfg_key) {
    pass p = { r0, j->w->rows - r0 < ROWS ? j->w->rows - r0 : ROWS, t0, 0, { 0 }, abuf, a_stride, 0 };
    for (int t = t0; t < j->T && p.ng < GROUPS; t += GROUP) p.widths[p.ng++] = j->T - t < GROUP ? j->T - t : GROUP;
    const int key = p.ng | p.widths[0] << 2 | p.widths[1] << 8 | p.widths[2] << 14;
    if (key != *cfg_key) { configure(p.widths, p.ng); *cfg_key = key; }
    _tile_zero(0);
    if (p.ng > 1) _tile_zero(1);
    if (p.ng > 2) _tile_zero(2);
    return p;
}

/* C_g += A(k-tiles [k0, k1)) . B_g */
static void pass_steps(const amx_job *j, const pass *p, int k0, int k1) {
    const size_t bstride = (size_t)j->tpad * 4;
    if (p->ng == 1) {
        for (int kt = k0; kt < k1; kt++) {
            const uint32_t *b = j->xv + (size_t)kt * (KTILE / 2) * j->tpad + p->t0;
            const uint16_t *a = p->abuf + (size_t)(kt - p->a_kt0) * KTILE;
            if (kt & 1) {   /* the intrinsics take tile numbers as literals: 5 = TILE_A_ODD, 6 = TILE_B_ODD */
                _tile_loadd(5, a, p->a_stride);
                _tile_loadd(6, b, bstride);
                _tile_dpbf16ps(0, 5, 6);
            } else {
                _tile_loadd(3, a, p->a_stride);
                _tile_loadd(4, b, bstride);
                _tile_dpbf16ps(0, 3, 4);
            }
        }
        return;
    }
    for (int kt = k0; kt < k1; kt++) {
        const uint32_t *b = j->xv + (size_t)kt * (KTILE / 2) * j->tpad + p->t0;
        _tile_loadd(3, p->abuf + (size_t)(kt - p->a_kt0) * KTILE, p->a_stride);
        _tile_loadd(4, b, bstride);
        _tile_dpbf16ps(0, 3, 4);
        if (p->ng > 1) {
            _tile_loadd(5, b + GROUP, bstride);
            _tile_dpbf16ps(1, 3, 5);
        }
        if (p->ng > 2) {
            _tile_loadd(6, b + 2 * GROUP, bstride);
            _tile_dpbf16ps(2, 3, 6);
        }
    }
}

static void pass_end(const amx_job *j, const pass *p) {
    float c[GROUPS][ROWS][GROUP];
    _tile_stored(0, c[0], GROUP * 4);
    if (p->ng > 1) _tile_stored(1, c[1], GROUP * 4);
    if (p->ng > 2) _tile_stored(2, c[2], GROUP * 4);
    for (int g = 0; g < p->ng; g++)
        for (int t = 0; t < p->widths[g]; t++) {
            const int tok = p->t0 + g * GROUP + t;
            float *yt = j->y_rows ? j->y_rows[tok] : j->y + (int64_t)tok * j->ldy;
            for (int r = 0; r < p->nr; r++) yt[p->r0 + r] = c[g][r][t];
        }
}

/* Columns [c0, c0 + nc) of row r of block rb into buf + r * nc (zeros past the weight's rows). */
static void decode_row(const amx_job *j, int rb, int r, int c0, int nc, uint16_t *buf, float *ftmp) {
    uint16_t *out = buf + (size_t)r * nc;
    const int row = rb * ROWS + r;
    if (row >= j->w->rows) {
        memset(out, 0, sizeof(uint16_t) * (size_t)nc);
        return;
    }
    /* One token reads each weight once, 16 rows a chunk at a time: the hardware prefetchers did not keep
     * those 16 short streams ahead of the decoders, which waited on their loads (one-thread FP4 decode at a
     * third of the fp32 kernels' speed). So the bytes this row needs next are requested now: its next chunk,
     * or at the end of the row the same row of the next block. */
    const dsv4_weight *w = j->w;
    const char *base = (const char *)w->data;
    const size_t row_bytes = weight_cols_bytes(w, w->cols);
    if (c0 + nc < w->cols) prefetch_bytes(base + (size_t)row * row_bytes + weight_cols_bytes(w, c0 + nc), weight_cols_bytes(w, nc));
    else if (row + ROWS < w->rows) prefetch_bytes(base + (size_t)(row + ROWS) * row_bytes, weight_cols_bytes(w, nc));
    row_bf16(j->w, row, c0, nc, out, ftmp);
}

/* Up to 48 tokens (decode, most expert calls): the weights are decoded a column chunk of a row block at a time
 * (16 rows x CHUNK columns of bf16 = 16 KiB), two chunk buffers in turn, and the tile steps of one chunk are
 * spread between the row decodes of the next, a k-tile or two after each row. The AMX unit then works while
 * the cores decode (a block's steps issued back to back stalled the decoding behind them: they took a quarter
 * of OFFICIAL decode time), a tile load never reads data stored just before it (it would wait for those
 * stores to reach the cache), and the decoded bf16 stays in L1 (a whole decoded block, 128 KiB for 4096
 * columns, went through L2 and back: one-token FP4 linears ran at half the fp32 kernels' speed). The next
 * block's first chunk is decoded during the last chunk of this one. More tokens: each block decoded whole,
 * then a pass per 48 tokens. Every output takes the same tile steps in the same order on either path. */
enum { CHUNK = 512 };
static void amx_rows(void *ctx, int b0, int b1, int thread) {
    const amx_job *j = ctx;
    const int n32 = j->n32, kts = n32 / KTILE;
    const size_t block = ROWS * (size_t)n32;
    uint16_t *abuf = thread_scratch(sizeof(uint16_t) * 2 * block + sizeof(float) * (size_t)n32);
    if (!abuf) return;   /* out of memory for a few hundred KiB: y stays untouched rather than crash */
    float *ftmp = (float *)(abuf + 2 * block);
    int cfg_key = -1;
    if (j->T > GROUPS * GROUP) {
        for (int rb = b0; rb < b1; rb++) {
            for (int r = 0; r < ROWS; r++) decode_row(j, rb, r, 0, n32, abuf, ftmp);
            for (int t0 = 0; t0 < j->T; t0 += GROUPS * GROUP) {
                const pass p = pass_begin(j, abuf, (size_t)n32 * 2, rb * ROWS, t0, &cfg_key);
                pass_steps(j, &p, 0, kts);
                pass_end(j, &p);
            }
        }
    } else {
        const int cw = n32 < CHUNK ? n32 : CHUNK, nch = (n32 + cw - 1) / cw, items = (b1 - b0) * nch;
        uint16_t *const buf[2] = { abuf, abuf + ROWS * (size_t)cw };   /* 2 * ROWS * cw <= 2 * block */
        pass p;
        for (int r = 0; r < ROWS; r++) decode_row(j, b0, r, 0, cw, buf[0], ftmp);
        for (int i = 0; i < items; i++) {
            const int rb = b0 + i / nch, c0 = (i % nch) * cw, kt0 = c0 / KTILE;
            const int kt1 = (n32 - c0 < cw ? n32 : c0 + cw) / KTILE;
            if (c0 == 0) p = pass_begin(j, NULL, (size_t)cw * 2, rb * ROWS, 0, &cfg_key);
            p.abuf = buf[i & 1];
            p.a_kt0 = kt0;
            int k = kt0;
            if (i + 1 < items) {
                const int nrb = b0 + (i + 1) / nch, nc0 = ((i + 1) % nch) * cw;
                const int per_row = (kt1 - kt0 + ROWS - 1) / ROWS;
                for (int r = 0; r < ROWS; r++) {
                    decode_row(j, nrb, r, nc0, cw, buf[(i + 1) & 1], ftmp);
                    const int k1 = k + per_row < kt1 ? k + per_row : kt1;
                    pass_steps(j, &p, k, k1);
                    k = k1;
                }
            }
            pass_steps(j, &p, k, kt1);
            if (kt1 == kts) pass_end(j, &p);
        }
    }
    _tile_release();
}

int cpu_amx_tokens_make(cpu_amx_tokens *b, const float *x, int T, int ldx, int cols) {
    const int n32 = (cols + KTILE - 1) / KTILE * KTILE, tpad = (T + GROUP - 1) / GROUP * GROUP, full = cols / 2;
    *b = (cpu_amx_tokens){ NULL, T, tpad, n32, cols };
    if (T <= 0) return -1;
    b->xv = aligned_alloc(64, sizeof(uint32_t) * (size_t)(n32 / 2) * tpad);
    if (!b->xv) return -1;
    /* A B tile is as wide as its token group, so tile loads read only tokens [0, T) of a pair row: what needs
     * zeros is the pair rows past the columns (the last k-tile's padding), not the whole buffer (for one token
     * that was 16x the data, cleared before every linear). */
    for (int p = full; p < n32 / 2; p++) memset(b->xv + (size_t)p * tpad, 0, sizeof(uint32_t) * (size_t)tpad);
    /* the caller promised bf16 values, so dropping the low half is exact: pair p of token t is the high words of
     * x[2p] and x[2p + 1], i.e. 16 pairs are the odd words of 32 consecutive floats */
    const __m512i odd_words = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                               31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(tpad));
    for (int t = 0; t < T; t++) {
        const float *xt = x + (int64_t)t * ldx;
        int p = 0;
        for (; p + 16 <= full; p += 16) {
            const __m512i lo = _mm512_loadu_si512((const void *)(xt + 2 * p)), hi = _mm512_loadu_si512((const void *)(xt + 2 * p + 16));
            _mm512_i32scatter_epi32((void *)(b->xv + (size_t)p * tpad + t), rows, _mm512_permutex2var_epi16(lo, odd_words, hi), 4);
        }
        for (; p < full; p++)
            b->xv[(size_t)p * tpad + t] = f32_bits_hi(xt[2 * p]) | (uint32_t)f32_bits_hi(xt[2 * p + 1]) << 16;
        if (cols % 2) b->xv[(size_t)full * tpad + t] = f32_bits_hi(xt[cols - 1]);
    }
    return 0;
}

void cpu_amx_tokens_free(cpu_amx_tokens *b) {
    free(b->xv);
    b->xv = NULL;
}

void cpu_amx_rows(const dsv4_weight *w, const cpu_amx_tokens *b, float *y, int ldy, int r0, int r1, int thread) {
    const amx_job j = { w, b->xv, b->T, b->tpad, b->n32, y, NULL, ldy };
    if (r0 < r1) amx_rows((void *)&j, r0 / ROWS, (r1 + ROWS - 1) / ROWS, thread);
}

void cpu_linear_amx(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx,
                    float *y, int ldy, float *const *y_rows) {
    if (T <= 0) return;
    cpu_amx_tokens b;
    if (cpu_amx_tokens_make(&b, x, T, ldx, w->cols)) {   /* cannot happen for real configs; the fp32 path still gives an answer */
        if (y_rows) cpu_linear_scatter(pool, w, x, T, ldx, y_rows);
        else cpu_linear(pool, w, x, T, ldx, y, ldy);
        return;
    }
    amx_job j = { w, b.xv, T, b.tpad, b.n32, y, y_rows, ldy };
    dsv4_pool_run(pool, (w->rows + ROWS - 1) / ROWS, amx_rows, &j);
    cpu_amx_tokens_free(&b);
}
