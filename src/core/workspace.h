/* Scratch memory for one dsv4_step, owned by the model and grown on demand. Nothing in it survives a step:
 * all state that outlives a step lives in the sequences. */
#ifndef DSV4_CORE_WORKSPACE_H
#define DSV4_CORE_WORKSPACE_H
#include "core/hc.h"
#include "core/sample.h"
#include <stdint.h>

/* The tokens of one step, flattened over its items (sequences). */
typedef struct {
    int T, n_items;
    dsv4_step_item *items;
    int *first;          /* [n_items + 1]: tokens of item i are first[i] .. first[i+1]-1 */
    int *item_of;        /* [T] */
    int64_t *pos;        /* [T] absolute position */
    int32_t *tok;        /* [T] token id */
} dsv4_batch;

typedef struct dsv4_workspace {
    int T_cap;           /* buffers below are sized for this many tokens */
    int64_t rows_cap;    /* per-thread key scratch is sized for window + this many compressed rows */
    int n_threads;
    dsv4_batch batch;
    float *X;            /* [T][hc*d] residual streams */
    float *u, *xn;       /* [T][d] hc_pre output, normalised sub-layer input */
    float *mixbuf;       /* [T][hc mix] */
    dsv4_hc_mix *mix;    /* [T] */
    float *sub;          /* [T][d] sub-layer output */
    /* attention */
    float *qr, *q, *kv, *o, *z;
    float *ck, *cz, *ick, *icz;  /* compressor projections */
    float *qi, *wi;              /* indexer queries and head weights */
    int32_t *sel;                /* [T][index_topk] selected rows */
    int *n_sel;                  /* [T] */
    float *pooled;               /* [d_max] */
    float *keyscratch;           /* [threads][ATT_GROUP][window + rows_cap] scores (attention: a group of heads; before
                                    it, the indexer's of a step of fewer tokens than threads, [t][window + rows_cap]:
                                    core/attention.c index_select) */
    float *idxscratch;           /* [threads][index_topk] heap of indexer scores */
    int32_t *heapscratch;        /* [threads][index_topk] */
    const float **keyptrs;       /* [threads][window + rows_cap] key rows of one query */
    /* MoE */
    float *router;               /* [T][E] */
    int32_t *route_e;            /* [T][n_act] */
    float *route_w;              /* [T][n_act] */
    int32_t *moe_first;          /* [E + 1] pair offsets (moe_pair_offsets) */
    int pair_cap;                /* routed pair rows of one expert group (moe_pair_cap) */
    int32_t *pair_tok;           /* [pair_cap] the token of each pair row */
    float *pair_w;               /* [pair_cap] its routing weight */
    float *pair_x, *pair_g, *pair_v, *pair_y; /* [pair_cap] x [d], gate / up [I], outputs [d] */
    float *ex, *eg, *ev, *ey;    /* MoE: quantized inputs [T][d], the shared expert's gate/up [T][I] and outputs [T][d] */
    float *acc;                  /* [T][d] fp32 MoE sum */
    /* head */
    float **head_out;            /* [T] where each logits row of the step goes */
    /* sampling in the step (dsv4_step_item.sample) */
    float *sample_rows;          /* [sample_rows_cap][vocab]: last rows of items that sample but want no logits */
    int sample_rows_cap;
    sample_scratch sample;
} dsv4_workspace;

struct dsv4_model;
int  workspace_ensure(struct dsv4_model *m, int T, int64_t max_rows);
void dsv4_workspace_free(dsv4_workspace *ws);
#endif
