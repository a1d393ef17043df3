/* cpu_linear: the pool's kernel set (isa.h) computes the rows, split across its threads. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/amx.h"
#include "backend/cpu/isa.h"

void cpu_linear(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy) {
    cpu_linear_job j = { w, x, y, NULL, T, ldx, ldy };
    if (T <= 0) return;
    dsv4_pool_run(pool, w->rows, dsv4_pool_kernels(pool)->linear_rows, &j);
}

void cpu_linear_scatter(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *const *y_rows) {
    cpu_linear_job j = { w, x, NULL, y_rows, T, ldx, 0 };
    if (T <= 0) return;
    dsv4_pool_run(pool, w->rows, dsv4_pool_kernels(pool)->linear_rows, &j);
}

void cpu_linear_bf16in(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy) {
    if (T <= 0) return;
    if (cpu_amx_usable(w)) cpu_linear_amx(pool, w, x, T, ldx, y, ldy, NULL);
    else cpu_linear(pool, w, x, T, ldx, y, ldy);
}

void cpu_linear_bf16in_scatter(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *const *y_rows) {
    if (T <= 0) return;
    if (cpu_amx_usable(w)) cpu_linear_amx(pool, w, x, T, ldx, NULL, 0, y_rows);
    else cpu_linear_scatter(pool, w, x, T, ldx, y_rows);
}
