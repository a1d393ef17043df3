/* The CPU kernels as a set chosen at run time: one binary carries the fp32 kernels compiled once per instruction
 * set (src/backend/cpu/isa/, built by the Makefile for "scalar", "avx2", "avx512" and "avx512bf16" on x86-64,
 * "scalar" elsewhere, each with its own symbol suffix) and a process picks one set per pool (pool.h), i.e. per model.
 *
 * Every set gives the same bits: each output element has one reduction order, written down in kernels.h
 * (dot_f32) and tile.h, and the AVX-512, AVX2 and scalar forms run exactly that order (32 lanes, one FMA per
 * lane per step, vec_reduce32's tree); likewise the pair order of OFFICIAL's bf16-input linears (pairs.h); the
 * decoders produce exact values. tests/unit/test_isa.c memcmps the
 * kernels and a model's logits across every set this CPU can run. Only speed depends on the choice.
 *
 * The sets are immutable tables (no state); which one runs is the pool's (dsv4_pool_kernels). */
#ifndef DSV4_CPU_ISA_H
#define DSV4_CPU_ISA_H
#include "dsv4.h"
#include "backend/cpu/pairs.h"
#include "model/weight.h"

/* Inside the files of src/backend/cpu/isa/: ISA_FN(f) is f's name in this instruction set's copy (f_avx2, ...). */
#define ISA_CAT2(a, b) a##_##b
#define ISA_CAT(a, b) ISA_CAT2(a, b)
#define ISA_FN(f) ISA_CAT(f, DSV4_ISA)

/* One call of cpu_linear / cpu_linear_scatter: y[t*ldy + o] (or y_rows[t][o]) = W x[t]. */
typedef struct {
    const dsv4_weight *w;
    const float *x;
    float *y;               /* y[t*ldy + o], or, when y_rows is set, y_rows[t][o] */
    float *const *y_rows;
    int T, ldx, ldy;
} cpu_linear_job;

typedef struct cpu_kernels {
    const char *name;       /* "avx512bf16", "avx512", "avx2", "scalar" */
    /* output rows [begin, end) of a linear (a dsv4_range_fn over rows; ctx is a cpu_linear_job) */
    void (*linear_rows)(void *job, int begin, int end, int thread);
    void (*decode_row)(const dsv4_weight *w, int row, float *out);
    float (*dot_row)(const dsv4_weight *w, int row, const float *x, float *scratch);
    /* act_quant_fp8_inplace / round_bf16_array (formats.h): exact element-wise definitions */
    void (*act_quant_fp8)(float *x, int n, int block);
    void (*round_bf16)(float *x, long n);
    /* the pair order (pairs.h): rows [begin, end) of a cpu_pairs_job; the tokens' bf16s and ranges (b's buffers
     * sized by the caller); columns [c0, c0 + nc) of a weight row as bf16 (zero beyond cols; c0 a multiple of
     * 128, nc of 32; ftmp: room for a whole fp32 row), returning their exponent range */
    void (*pairs_rows)(void *job, int begin, int end, int thread);
    void (*pairs_fill)(const float *x, int ldx, cpu_pairs_tokens *b);
    pairs_exp (*row_bf16)(const dsv4_weight *w, int row, int c0, int nc, uint16_t *out, float *ftmp);
    /* the lightning indexer's scores of rows[0 .. n-1] (n <= CPU_INDEX_ROWS, fp32, cI columns) against one query's
     * nI heads qi [nI][cI] with head weights wi, in core/attention.c's order (isa/index.c) */
    void (*index_scores)(const float *qi, const float *wi, const float *const *rows, int n, int nI, int cI, int official,
                         float *out);
    /* `steps` rounds of the multiply-add the set's linears compute with (VDPBF16PS where bf16 is set and the set
     * has it, else its fp32 FMA), on registers only (isa/peak.c); returns the flops done, adds a result to *sink */
    double (*peak_flops)(int bf16, long steps, float *sink);
} cpu_kernels;
#define CPU_INDEX_ROWS 8

#ifdef DSV4_ISA   /* the members of one set, defined in src/backend/cpu/isa/ (tile.h declares the tile kernel) */
void ISA_FN(linear_rows)(void *job, int begin, int end, int thread);
void ISA_FN(weight_decode_row)(const dsv4_weight *w, int row, float *out);
float ISA_FN(weight_dot_row)(const dsv4_weight *w, int row, const float *x, float *scratch);
/* Many rows of w against one x: a form of x that this set's fused dot reads faster (written to buf, w->cols
 * floats), or NULL when it has none for w's format; then weight_dot_prepared(w, row, that) == weight_dot_row. */
const float *ISA_FN(weight_dot_prepare)(const dsv4_weight *w, const float *x, float *buf);
float ISA_FN(weight_dot_prepared)(const dsv4_weight *w, int row, const float *xp);
void ISA_FN(act_quant_fp8)(float *x, int n, int block);
void ISA_FN(round_bf16)(float *x, long n);
void ISA_FN(pairs_rows)(void *job, int begin, int end, int thread);
void ISA_FN(pairs_fill)(const float *x, int ldx, cpu_pairs_tokens *b);
pairs_exp ISA_FN(weight_row_bf16)(const dsv4_weight *w, int row, int c0, int nc, uint16_t *out, float *ftmp);
double ISA_FN(peak_flops)(int bf16, long steps, float *sink);
void ISA_FN(index_scores)(const float *qi, const float *wi, const float *const *rows, int n, int nI, int cI, int official,
                          float *out);
#endif

/* The best set this CPU runs (AVX-512 with BF16 > AVX-512 > AVX2 > scalar). The avx512bf16 set differs from
 * avx512 only in the pair order's tiles (VDPBF16PS, pairs.h) and runs only where its start-up check passed. */
const cpu_kernels *cpu_kernels_best(void);
/* The set named `name` ("avx512bf16", "avx512", "avx2", "scalar"); NULL, "" or "auto": $DSV4_ISA when set, else the best.
 * Fails with one line (DSV4_E_ARG for an unknown name, DSV4_E_UNSUPPORTED when this build or CPU cannot run
 * it). */
int cpu_kernels_pick(const char *name, const cpu_kernels **out, dsv4_error *err);
/* The sets compiled into this binary, best first, space-separated ("avx512bf16 avx512 avx2 scalar"). */
const char *cpu_kernels_built(void);
/* Whether this CPU can run the set named `name` (tests loop over the sets). */
int cpu_kernels_runnable(const char *name);
#endif
