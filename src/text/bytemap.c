#include "text/bytemap.h"

static int keeps_itself(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* Computed on the fly: the mapping is a pure function of b and cheap (<= 256 steps only for shifted bytes,
 * which only the loader and decoder-table builder call), so no global table is needed. */
uint32_t dsv4_byte_to_cp(unsigned char b) {
    if (keeps_itself(b)) return b;
    uint32_t shifted = 0;
    for (unsigned x = 0; x < b; x++)
        if (!keeps_itself(x)) shifted++;
    return 0x100 + shifted;
}

int dsv4_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return keeps_itself(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    uint32_t k = cp - 0x100;
    for (unsigned x = 0; x < 256; x++)
        if (!keeps_itself(x) && k-- == 0) return (int)x;
    return -1;
}
