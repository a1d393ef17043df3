/* The tensor inventory: every tensor a checkpoint of a given config must contain, with its dtype and shape
 * (spec §2.4). The loader validates against it; `dsv4 tiny` writes exactly it. One list, two users. */
#ifndef DSV4_MODEL_INVENTORY_H
#define DSV4_MODEL_INVENTORY_H
#include "model/config.h"
#include "model/safetensors.h"

typedef enum { MTP_NONE = 0, MTP_V4 = 1, MTP_DSPARK = 2 } dsv4_mtp_kind;

typedef struct {
    char     name[128];
    st_dtype dtype;        /* the official dtype */
    st_dtype alt;          /* a second accepted dtype (e.g. I64 for tid2eid, BF16 for a dequantized wo_a);
                              equal to dtype when only one is accepted */
    int      ndim;
    int64_t  shape[2];
} dsv4_tensor_spec;

typedef struct {
    dsv4_tensor_spec *v;
    int n, cap;
} dsv4_inventory;

/* Build the list for cfg; `mtp` selects which speculative-head tensors are included. */
int  dsv4_inventory_build(const dsv4_config *cfg, dsv4_mtp_kind mtp, dsv4_inventory *inv, dsv4_error *err);
void dsv4_inventory_free(dsv4_inventory *inv);
/* Check that every spec'd tensor is in the archive with an accepted dtype and the exact shape. */
int  dsv4_inventory_check(const dsv4_inventory *inv, const st_archive *a, dsv4_error *err);

/* Shape rule of a FP8 block scale: [ceil(O/128), ceil(I/128)]. */
static inline int64_t fp8_scale_dim(int64_t n) { return (n + 127) / 128; }
/* Number of mHC mixing logits: pre (hc) + post (hc) + comb (hc*hc). */
static inline int hc_mix_count(int hc) { return (2 + hc) * hc; }
#endif
