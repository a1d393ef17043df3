/* This instruction set's kernel table (isa.h): cpu_kernels_avx512bf16, cpu_kernels_avx512, cpu_kernels_avx2 or cpu_kernels_scalar. */
#include "backend/cpu/isa.h"

#define ISA_STR2(x) #x
#define ISA_STR(x) ISA_STR2(x)

const cpu_kernels ISA_FN(cpu_kernels) = {
    .name = ISA_STR(DSV4_ISA),
    .linear_rows = ISA_FN(linear_rows),
    .decode_row = ISA_FN(weight_decode_row),
    .dot_row = ISA_FN(weight_dot_row),
    .act_quant_fp8 = ISA_FN(act_quant_fp8),
    .round_bf16 = ISA_FN(round_bf16),
    .pairs_rows = ISA_FN(pairs_rows),
    .pairs_fill = ISA_FN(pairs_fill),
    .row_bf16 = ISA_FN(weight_row_bf16),
    .index_scores = ISA_FN(index_scores),
    .peak_flops = ISA_FN(peak_flops),
};
