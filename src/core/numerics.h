/* The two numeric modes (DESIGN §3). EXACT: fp32, no simulation. OFFICIAL: the official model's rounding
 * points (spec §16.1). Every rounding point in the forward pass goes through these helpers, so the EXACT path
 * is the OFFICIAL path with the roundings switched off. */
#ifndef DSV4_CORE_NUMERICS_H
#define DSV4_CORE_NUMERICS_H
#include "dsv4.h"
#include "model/formats.h"
#include "backend/cpu/kernels.h"

static inline int is_official(dsv4_mode m) { return m == DSV4_MODE_OFFICIAL; }

/* Round n values to bf16 in OFFICIAL mode (no-op in EXACT). */
static inline void num_bf16(dsv4_mode m, float *x, long n) {
    if (!is_official(m)) return;
    round_bf16_array(x, n);
}
static inline float num_bf16_1(dsv4_mode m, float x) { return is_official(m) ? round_bf16(x) : x; }

/* y = W x for an input whose values OFFICIAL mode has made exact bf16s: FP8-quantized (act_quant_fp8_inplace,
 * the FP8 linears' inputs) or rounded to bf16 (the BF16 and fp32 linears of spec §3.6 whose input is a bf16
 * tensor: wo_a, the compressors, the indexer's weights_proj, the router, the LM head), in the order the model
 * chose at load (`dots`, kernels.h: CPU_DOTS_F32 in EXACT mode and on the GPU's host side, the pair order of
 * backend/cpu/pairs.h by default in OFFICIAL mode on the CPU, AMX's with cpu_amx), for every T. Products of two
 * bf16s are exact in fp32, so only the accumulation order differs from the official GPU kernels' (spec §3.6). */
static inline void linear_bf16_in(cpu_dots dots, dsv4_pool *pool, const dsv4_weight *w, const float *x, int T,
                                  int ldx, float *y, int ldy) {
    cpu_linear_bf16in(pool, dots, w, x, T, ldx, y, ldy);
}
/* The same with one output row per token, y_rows[t] (the LM head writing into each caller's logits). */
static inline void linear_bf16_in_scatter(cpu_dots dots, dsv4_pool *pool, const dsv4_weight *w, const float *x, int T,
                                          int ldx, float *const *y_rows) {
    cpu_linear_bf16in_scatter(pool, dots, w, x, T, ldx, y_rows);
}
#endif
