/* The CUDA backend's operations, as C calls (launchers). Each launcher enqueues its kernel(s) on `st` and
 * returns at once; cu_check (cu_runtime.cu) reports a launch or execution error afterwards.
 *
 * Every launcher computes one operation of the model (src/core/ has the same operation on the CPU, named in
 * each comment) and states its reduction order. Two rules hold for all of them:
 *   - each output element is reduced in an order fixed by the model's shapes (and, for attention and the
 *     indexer, by the context length): never by the number of tokens in the step or by who the neighbours are;
 *   - no floating-point atomics. (The MoE planner and the indexer's radix select count with integer atomics in
 *     shared memory, which are exact in any order.)
 * So every kernel here is batch-invariant and deterministic: one-shot, chunked, decode and batched steps give
 * the same bits, run after run. Pointers are device pointers unless a comment says otherwise. */
#ifndef DSV4_CU_KERNELS_H
#define DSV4_CU_KERNELS_H
#include "model/synth_values.h"
#include "model/weight.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *cu_stream;

/* One step item as the kernels see it: its tokens are first .. first+n-1 of the step, at positions p0 .. */
typedef struct {
    int first, n;
    int64_t p0;
} cu_item;

/* One sequence's state for one layer (device pointers into the sequence, state/sequence.h). */
typedef struct {
    uint8_t *ring;             /* window ring [ring_len][main row bytes] */
    float *ckv, *cscore;       /* main compressor ring [chist][cols] (ratio != 0) */
    float *ikv, *iscore;       /* indexer compressor ring [ihist][2*index_head_dim] (ratio 4) */
    uint8_t *crows, *irows;    /* compressed / indexer rows (capacity reserved for the step) */
    int chist, ihist;
} cu_seq_layer;

/* A KV row layout (state/kvrows.h kv_layout). */
typedef struct {
    int fmt, kind, width, rope, nope, bytes;
} cu_kvlay;

/* The MoE plan of one step: (token, expert) pairs sorted by expert then token, cut into tiles of up to `tile`
 * pairs of one expert: CU_MOE_TILE (one n8 column of the tensor cores, the CUDA-core kernels' LIN_TILE), or a
 * multiple of it for a long step on tensor cores, where an expert's weight is read once per tile (cu_moe_routed).
 * Which tile a pair lands in never changes its row's bits (k_mma.cu, k_linear.cu). */
#define CU_MOE_TILE 8
typedef struct {
    int32_t *pair_token;   /* [T*K] */
    float   *pair_weight;  /* [T*K] routing weight of the pair */
    int32_t *tile_expert, *tile_first, *tile_count;   /* [max_tiles] */
    int32_t *n_tiles;      /* [1] */
    int32_t *token_pairs;  /* [T][K]: the token's pairs in increasing expert id, then -1 */
    int tile;              /* pairs a tile at most; 0 = CU_MOE_TILE (cu_moe_plan_build sets it) */
} cu_moe_plan;

/* ---- synthetic weights (k_synth.cu, model/synthetic.h) ------------------------------------------------------- */
enum { CU_SYNTH_FP8 = SYNTH_FP8, CU_SYNTH_FP4 = SYNTH_FP4, CU_SYNTH_BF16 = SYNTH_BF16 };   /* model/synth_values.h */
/* n bytes of random values of the kind at p (model/synth_values.h; default stream; the loader waits with cu_sync). */
void cu_fill_synth(void *p, size_t n, int kind, uint64_t seed);

/* ---- linear layers (backend/cpu/linear.c cpu_linear) ------------------------------------------------------
 * y[t*ldy + o] = sum_i W[o][i] x[t*ldx + i]. One warp per output row: lane l accumulates, with fmaf, the
 * products of columns 16l + 512j + {0..15} for j = 0, 1, ... in that order; then warp_sum. Weights of fewer
 * than 128 rows of at least 2048 columns split each row into 8 fixed column segments (one warp each) whose
 * partials are added in segment order: the split depends on the weight's shape, never on T. How many rows and
 * tokens one warp takes (several rows at once for a step of one token) changes who computes an element, never its
 * order. */
int  cu_linear(cu_stream st, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy);
/* The grouped output projection in one launch: w's rows split in `groups` equal parts, part g reading the input
 * columns from x + g * group_x and writing y's columns [g * rows / groups, ...); per row the same sum as cu_linear
 * over that part alone. */
int  cu_linear_grouped(cu_stream st, const dsv4_weight *w, int groups, const float *x, int T, int ldx, int group_x, float *y,
                       int ldy);
/* The same product for the MoE: tile k multiplies expert tile_expert[k]'s matrix (experts: a device array of
 * E weights of one shape rows x cols) with the rows of its pairs: x row = pair_token[p] (x_by_pair 0) or p
 * (x_by_pair 1); y row = p. Same per-element order as cu_linear. An expert whose weight has data NULL (held by
 * another GPU, cuda_ep.h) writes its rows as -0.0f. */
int  cu_expert_linear(cu_stream st, const dsv4_weight *experts, int rows, int cols, int fmt, const cu_moe_plan *plan,
                      int max_tiles, const float *x, int ldx, int x_by_pair, float *y, int ldy, int one_token);

/* ---- per-token operations ----------------------------------------------------------------------------------- */

/* X[t][i*d + e] = embed[tok[t]][e] for every stream i (core/forward.c embed_tokens). */
void cu_embed(cu_stream st, const dsv4_weight *embed, const int32_t *tok, int T, int hc, int d, float *X);
/* y = w * (x / sqrt(mean(x^2) + eps)) per row (core/norm.c rmsnorm); the sum of squares is a block_sum over
 * 256 threads, thread k taking elements k, k+256, ... in order. x and y may alias. */
void cu_rmsnorm(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y, int ldy,
                int rows);
/* cu_rmsnorm, and each output row also packed for the tensor cores into q / qs (cu_mma.h) by the same block. */
void cu_rmsnorm_pack(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y, int ldy,
                     int rows, uint8_t *q, int ldq, float *qs, int lds);
void cu_round_bf16(cu_stream st, float *x, int64_t n);
/* y = the official FP8 (fp4 = 0, E4M3) or FP4 (fp4 = 1, E2M1) fake quantization of x per `block` columns
 * (model/formats.c act_quant_*_inplace); x and y may alias. amax is a max: exact in any order. */
void cu_act_quant(cu_stream st, const float *x, int ldx, float *y, int ldy, int rows, int n, int block, int fp4);
/* mHC before a sub-layer (core/hc.c hc_pre), after cu_linear gave mixraw = fn X: scale by 1/rms(X), pre / post
 * / Sinkhorn-normalised comb per token, u = sum_i pre[i] X_i (streams summed in order i = 0..hc-1). mix is
 * [T][CU_MIX] floats: post[8] then comb[64]. norm non-NULL: then also the sub-layer's RMSNorm of u into xn
 * [T][d] by the same block, with cu_rmsnorm's order and bits (each thread's u elements are the ones its
 * sum_squares would take, in the same order): one launch a sub-layer fewer. xq non-NULL (with norm): xn also
 * packed for the tensor cores into xq / xqs (cu_mma.h; the bytes of cu_mma_pack_act) by the same block; xb non-NULL
 * (with norm): xn also as bf16 into xb (row stride ldb; the bytes of cu_mma16_pack) for the BF16-input linears. */
#define CU_MIX 72
void cu_hc_pre_finish(cu_stream st, int official, const float *mixraw, const float *X, int T, int hc, int d,
                      const float *base, const float *scale, float hc_eps, float norm_eps, int iters, float *u, float *mix,
                      const float *norm, float *xn, uint8_t *xq, int ldq, float *xqs, int lds, uint16_t *xb, int ldb);
/* X_k <- post[k] f + sum_j comb[j][k] X_j (core/hc.c hc_post), j in order. */
void cu_hc_post(cu_stream st, int official, const float *f, const float *mix, float *X, int T, int hc, int d);
/* cu_hc_post after the MoE, its f made in place: f[t] = round(sum of the token's expert rows ey[token_pairs[t][k]] in
 * increasing expert id (its slot order, from 0.0f) + shared[t]). One launch instead of a combine and a post. */
void cu_hc_post_moe(cu_stream st, int official, const float *ey, const float *shared, const int32_t *token_pairs, int K,
                    const float *mix, float *X, int T, int hc, int d);
/* The head collapse of the rows[R] tokens (core/hc.c hc_head_one): y[r] [d]. */
void cu_hc_head(cu_stream st, int official, const float *X, const int32_t *rows, int R, const float *fn,
                const float *base, const float *scale, int hc, int d, float hc_eps, float norm_eps, float *y);
/* The MTP head's input (core/mtp.c mtp_input): X[t][s] = round(ep[t] + hp[t][s]) for every stream s. */
void cu_mtp_mix(cu_stream st, int official, const float *ep, const float *hp, float *X, int T, int hc, int d);
/* DSpark features (core/forward.c capture_features): feat[t][k][e] = mean over the streams of X (in order). */
void cu_features(cu_stream st, int official, const float *X, int T, int hc, int d, int nt, int k, float *feat);

/* ---- attention (core/attention.c) ------------------------------------------------------------------------------ */

/* What each token needs before the attention, in one launch (core/attention.c prepare_qkv and prepare_tokens):
 *   - q [T][H][D]: per head unit RMSNorm + RoPE (H may be 0: no query);
 *   - kv [T][D]: RMSNorm(kv_norm) + RoPE (+ OFFICIAL FP8 of the non-rope dims per 64); with kvs, the row encoded
 *     into kvs [T] (state/kvrows.c kv_encode) and, with ring, also into its item's window ring (slot pos %
 *     ring_len) at once: for a step whose items have one token each, where no query of the step reads the slot's
 *     old row (position pos - ring_len, out of every window: ring_len >= window), so the ring write after the
 *     attention (cu_ring_write) is not needed;
 *   - ratio > 0: the compressors' ape added to cz [T][cw] (and, ratio 4, to icz [T][2 cI]), the indexer's head
 *     weights wi [T][nI] scaled, its queries qi [T][nI][cI] rotated (OFFICIAL: Hadamard + FP4). */
typedef struct {
    int official, T, H, D, R;
    float eps;
    float *q, *kv;
    const float *kv_norm, *freq;
    const int64_t *pos;
    cu_kvlay lay;
    uint8_t *kvs;                  /* NULL: the kv row is not encoded */
    int ring, ring_len;
    const int32_t *item_of;
    const cu_seq_layer *sl;
    int ratio, cw, nI, cI;
    float *cz, *icz, *qi, *wi;
    const float *ape, *iape;
} cu_prep;
void cu_attn_prepare(cu_stream st, const cu_prep *a);
/* Rows [rows][width] fp32 -> the stored format (state/kvrows.c kv_encode). */
void cu_kv_encode(cu_stream st, cu_kvlay lay, const float *x, int ldx, uint8_t *dst, int rows);
/* The compressor state machine's emissions (core/compressor.c): every token that completes a chunk pools it
 * from the step's projections (positions >= the item's p0) and the sequence's ring (earlier ones), in the
 * slot order of pool_column, finishes the row and appends it at row index pos / ratio. One job a compressor of the
 * layer (the main one; with ratio 4 also the indexer's), all in one launch. ring_now (a step of one token per item):
 * each token also writes its compressor ring slots (cu_comp_ring_write's work) in the same launch. */
typedef struct {
    cu_kvlay lay;
    int is_indexer, ratio, cols;   /* cols: the projections' width (2 x the row width with ratio 4's overlap) */
    const float *K, *Z, *norm;     /* the step's projections [T][cols], the row norm's weight */
} cu_comp_job;
typedef struct {
    cu_comp_job job[2];
    int n;
} cu_comp_jobs;
void cu_compress(cu_stream st, int official, const cu_comp_jobs *jobs, const int64_t *pos, const int32_t *item_of,
                 const cu_item *items, const cu_seq_layer *sl, const float *freq, int R, float eps, int T, int ring_now);
/* Then (unless ring_now) the compressor rings: the projections of the step's last hist_len positions of each item. */
void cu_comp_ring_write(cu_stream st, const cu_comp_jobs *jobs, const int64_t *pos, const int32_t *item_of, const cu_item *items,
                        const cu_seq_layer *sl, int T);
/* The lightning indexer (select_rows): per query, the top-K visible indexer rows by score (ties to the lower
 * row), in row order. Scores: blocks of rows x one query (x 16 queries on the tensor cores) over the whole GPU; a
 * score's order is stated in k_indexer.cu (per head a dot, then the heads in order). Selection: an exact radix select on the
 * score keys with the ties at the threshold broken by row order, one block per query, or for a launch of at most
 * CU_INDEX_SPLIT_T queries spread over blocks of rows (the same rows either way). n_rows: the most visible
 * rows of any query of the step (the score grid); scratch: [CU_INDEX_CHUNK][max_rows] floats (queries go in
 * launches of CU_INDEX_CHUNK). Returns nonzero when the device cannot give the scoring kernel its shared memory. */
#define CU_INDEX_CHUNK 512
/* The indexer's scratch besides the scores.
 * mma: OFFICIAL scores on int8 tensor cores (k_indexer.cu states their order), used when official, mma and every
 * pointer below is set (and cI is 32, 64, 128 or 256): qc [T][nI][cI] int8 and qu [T][nI][cI/32] floats for the query
 * codes; offgrid a word in mapped host memory (cu_malloc_mapped) that becomes 1 / 2 when a query / row block is not
 * FP4-grid data (the scores are then not the stated ones: the caller fails the step). Else the fp32 scores.
 * split, split_words: cu_index_split_words(max_rows) words that let a launch of at most CU_INDEX_SPLIT_T queries
 * spread each query's selection over blocks of rows (NULL: one block a query).
 * tiles: with mma, the tensor cores take 8 queries of one head at a time instead of 8 heads of one query (the same
 * scores): for steps with runs of queries of one sequence (cu_index_tiles_pay). */
#define CU_INDEX_SPLIT_T 16
typedef struct {
    int mma;
    int8_t *qc;
    float *qu;
    unsigned *offgrid;
    unsigned *split;
    int64_t split_words;
    int tiles;
} cu_index_ws;
/* Whether a step of T queries over n_items sequences scores in query tiles: when its sequences average
 * CU_INDEX_TILE_MIN queries or more (a tile of 8 holding several sequences runs once for each). */
#define CU_INDEX_TILE_MIN 8
static inline int cu_index_tiles_pay(int T, int n_items) { return T >= CU_INDEX_TILE_MIN * n_items; }
int64_t cu_index_split_words(int64_t max_rows);
int cu_index_select(cu_stream st, int official, cu_index_ws iw, cu_kvlay ilay, const float *qi, const float *wi,
                    const int64_t *pos, const int32_t *item_of, const cu_seq_layer *sl, int T, int nI, int cI, int K,
                    int64_t n_rows, int64_t max_rows, float *scratch, int32_t *sel, int32_t *n_sel);
/* The selection alone (cu_index_select's last kernels; tests give it scores): queries t0 .. t0+T-1, query t0 + i's
 * scores of rows 0 .. (pos+1)/4 - 1 at scratch + i * max_rows; n_rows: the most rows a query sees. split as in
 * cu_index_ws (NULL: one block a query). */
void cu_index_topk(cu_stream st, const int64_t *pos, int t0, int T, int K, int64_t n_rows, int64_t max_rows,
                   const float *scratch, unsigned *split, int64_t split_words, int32_t *sel, int32_t *n_sel);
/* Sink attention of every (token, head) over its window keys (chronological) then its compressed rows (row
 * order); keys of the step come from kvs, older ones from the ring. Writes o [T][H][D] de-rotated.
 * ATT_CHUNKED (k_attention.cu, the default): a query's key list is cut into fixed chunks of 64 key indices, each
 * chunk scored for all heads at once (every row read once per query); score = a sequential fmaf dot over the
 * columns in order; one max over all keys; per chunk the denominator part and the P.V part (its keys in order,
 * from 0.0f); then the sink's term and the chunks' parts added in chunk order. Every order depends only on the
 * query's key set. scratch: scratch_floats floats, at least cu_attention_scratch_floats(1, H, D, max_keys); the
 * queries are run in groups that fit it (decided by its size only: results are the same for any size).
 * ATT_CHUNKED 0: one block per (token, head), scores one warp per key, the denominator over the keys in key order,
 * each output column in four interleaved partial sums (key i into i mod 4) added as (0 + 1) + (2 + 3) (scratch
 * unused). max_keys: at least the longest key list of the step. Nonzero when the scratch or the device cannot take
 * max_keys (nothing launched).
 * mma (OFFICIAL only, ATT_CHUNKED): scores and P.V on bf16 tensor cores (mma.sync m16n8k16; every product exact,
 * the summation the MMA's, chained over 16 columns / 16 keys in order; P.V parts of 256 keys): the order is stated
 * next to k_att_scores_mma in k_attention.cu. EXACT mode ignores it.
 * mma is a set of flags: CU_ATT_MMA (the tensor cores above), CU_ATT_NO_DEC (never the decode-sized kernels
 * k_att_scores_dec, k_att_dec and k_att_dec_mma, which a launch whose blocks fit in one wave takes otherwise: the same
 * bits, a switch for tests and A/B runs), CU_ATT_NO_FUSED (never k_att_dec, the whole attention of such a launch in
 * one kernel with two grid barriers; the same bits) and CU_ATT_NO_DEC_MMA (never k_att_dec_mma, the same on tensor
 * cores; the same bits as k_att_scores_mma + k_att_pv_mma + k_att_combine).
 * bar: two unsigned words of device memory, zero when allocated, for the grid barriers of k_att_dec and
 * k_att_dec_mma (each launch leaves them as it found them); used by one stream at a time. NULL: never either. */
#define CU_ATT_MMA 1
#define CU_ATT_NO_DEC 2
#define CU_ATT_NO_FUSED 4
#define CU_ATT_NO_DEC_MMA 8
int  cu_attention(cu_stream st, int official, int mma, cu_kvlay lay, const float *q, const uint8_t *kvs, const int64_t *pos,
                  const int32_t *item_of, const cu_item *items, const cu_seq_layer *sl, int ring_len, int W, int ratio,
                  const int32_t *sel, const int32_t *n_sel, int topk, const float *sink, const float *freq, int T, int H,
                  int D, int R, int max_keys, float *scratch, int64_t scratch_floats, unsigned *bar, float *o);
/* The scratch cu_attention wants for a step of T tokens whose queries see at most max_keys keys (floats): all T
 * queries at once up to 256 MiB, else as many as fit (at least one). */
/* How many of the launches (groups of queries) of cu_attention with these arguments take k_att_scores_dec: those
 * of the CUDA-core path whose blocks fit in one wave of the current GPU (tests: proof that the kernel ran). */
int  cu_attention_decode_launches(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats);
/* How many take k_att_dec (CUDA cores) or k_att_dec_mma (tensor cores: official and mma & CU_ATT_MMA) when barrier
 * words are given (the same rule, their own shared memory and blocks). */
int  cu_attention_fused_launches(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats);
int64_t cu_attention_scratch_floats(int T, int H, int D, int64_t max_keys);
/* A measuring build's record of one warp of the decode attention kernels (k_attention.cu, -DATT_BLOCK_TIMES=1):
 * kernel 1 k_att_scores_dec, 2 k_att_pv, 3 k_att_combine, 4 k_att_dec, 6 k_att_dec_mma; start, marks (0: not passed) and end in
 * %globaltimer ns. */
typedef struct {
    unsigned long long start, end, mark[4];
    unsigned long long clk_start, clk_end;   /* the SM's clock64 at start and end: its clock rate */
    unsigned kernel, sm, block, warp;
} cu_att_time;
/* Copies out (and clears) the records since the last call: their count, or -1 (a real build records nothing). */
int cu_att_block_times(cu_att_time *out, int max);
/* The same build: k_att_scores_dec launched twice back to back (twice != 0); -1 in a real build. */
int cu_att_block_times_twice(int twice);
/* DSpark's block attention (core/dspark.c): block element j (position p0 + j) over the context keys of positions
 * max(0, p0-W) .. p0-1 (ring: [W][D] fp32, slot = position mod W) then all gamma block keys (kv [gamma][D] fp32);
 * one block per (token, head) with the reductions of cu_attention's ATT_CHUNKED 0 kernel (k_attention.cu attend_keys). */
void cu_dspark_attention(cu_stream st, int official, const float *q, const float *kv, const float *ring, int64_t p0, int gamma,
                         int W, const float *sink, const float *freq, int H, int D, int R, float *o);
/* Rows [n][D] into a DSpark context ring at positions p0 .. p0+n-1. */
void cu_dspark_ring_write(cu_stream st, const float *kv, int n, int D, float *ring, int64_t p0, int W);
/* The most keys (window + compressed rows) one query of cu_attention can take: ATT_CHUNKED, one query's scratch
 * stays under 2 GiB (H heads of D columns); else what the GPU's shared memory holds. */
int  cu_attention_key_limit(int H, int D);
/* The window rings: the step's stored rows of each item's last ring_len positions. */
void cu_ring_write(cu_stream st, cu_kvlay lay, const uint8_t *kvs, const int64_t *pos, const int32_t *item_of,
                   const cu_item *items, const cu_seq_layer *sl, int ring_len, int T);

/* ---- MoE (core/moe.c) --------------------------------------------------------------------------------------------- */

/* Router: sqrt(softplus) scores, top-K by biased score (ties to the lower id) or the token's hash row, weights
 * normalised over the K picks in order and scaled. */
void cu_route(cu_stream st, float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int T, int E,
              int K, float route_scale, int32_t *route_e, float *route_w);
/* Pairs by expert then token (a token naming an expert twice counts once), tiles, and each token's pairs in
 * increasing expert id. One block; counts and positions are integers. */
void cu_moe_plan_build(cu_stream st, const int32_t *route_e, const float *route_w, int T, int K, int E, cu_moe_plan *p);
/* The token split (model/expert_split.h) on a built plan: each tile of an EXPERT_ON_SPLIT expert (owner: the layer's
 * row [E]) none of whose pairs the rule at pct sends over the bus is pointed at expert E, the absent entry every
 * expert array ends with (data NULL: its rows are written EP_ABSENT_ROW and its weights never read), so the GPU
 * reads a split expert over the bus only for a tile with a pair of its own. A tile's other pairs are computed too and
 * overwritten by the host's rows, which the step scatters later on the same stream. max_tiles: the plan's capacity. */
void cu_moe_split_tiles(cu_stream st, cu_moe_plan *p, const int32_t *route_e, int K, int E, const uint8_t *owner, int pct, int max_tiles);
/* cu_route, and when the step is small enough (T <= 8, the fast kernels' bounds) the plan of the same routing in
 * the same launch, with cu_moe_plan_build's bytes: 1 when *p was built, 0 when only the routing was. */
int cu_route_plan(cu_stream st, float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int T, int E, int K,
                  float route_scale, int32_t *route_e, float *route_w, cu_moe_plan *p);
/* The most tiles a plan of P pairs over E experts in tiles of `tile` pairs can have. */
static inline int cu_moe_tiles_max(int64_t P, int E, int tile) {
    return (int)(P / (tile > 0 ? tile : CU_MOE_TILE) + (E < P ? E : P) + 1);
}
/* counts[e] += 1 for each token's distinct experts in route_e [T][K] (dsv4 profile; integer atomics: the sum does
 * not depend on their order). */
void cu_count_routes(cu_stream st, const int32_t *route_e, int T, int K, unsigned long long *counts);
/* ey[pair[q]][.] = rows[q][.] for q < n: the host-computed pair rows into the step's pair rows (cuda_host_experts.h). */
void cu_scatter_pair_rows(cu_stream st, const float *rows, const int32_t *pair, int n, int d, float *ey);
/* The host link of a split step enqueued ahead (cuda_host_experts.h, cuda_hx_serve_start): words in page-locked mapped
 * memory, each monotonic within a step, zeroed by the host before it. What the GPU writes and what the host writes
 * lie in different 128-byte lines, and the GPU reads the host's words (and rows) with ld.global.cv and writes its own
 * with st.global.wt, so that no copy of a line of system memory in the GPU's L2 can hide a later write of the
 * host's. (That was the first guess at run 177's hang; the hang was the host's serving, cuda_host_experts.h, and
 * run 179 passed with this layout.) */
typedef struct {
    int published;   /* the GPU: layer L's rows and routing are in the host's buffers (L + 1) */
    int late;        /* the GPU: a wait for this value timed out (CU_HX_TIMEOUT_S), the step's results are void */
    int gpu_pad[30];
    int ready;       /* the host: layer L's host rows are in rows_h / pair_h (L + 1); INT_MAX: give up the step */
    int n;           /* the host: how many rows (written before ready) */
    int host_pad[30];
} cu_hx_link;
#define CU_HX_TIMEOUT_S 60
/* link->published = value once xn [T][d], route_e and route_w [T][K] are in the mapped xn_h, re_h, rw_h (blocks_done:
 * a device counter at 0, left at 0). */
void cu_hx_publish(cu_stream st, const float *xn, const int32_t *route_e, const float *route_w, int T, int d, int K, float *xn_h,
                   int32_t *re_h, float *rw_h, unsigned *blocks_done, cu_hx_link *link, int value);
/* Once link->ready >= value: cu_scatter_pair_rows of link->n rows from the mapped rows_h / pair_h (at most max_rows).
 * relay: 3 device words at 0, left at 0 (one block polls the host and hands the count to the others through them). */
void cu_hx_await_rows(cu_stream st, cu_hx_link *link, int value, const float *rows_h, const int32_t *pair_h, int max_rows, int d,
                      float *ey, unsigned *relay);
/* Clamped SwiGLU in place on g [rows][I] (v the up projection), times w[row] when w is not NULL. */
void cu_swiglu(cu_stream st, int official, float *g, const float *v, const float *w, int rows, int I, float limit);
/* cu_swiglu, and each output row also packed for the tensor cores into q / qs (cu_mma.h) in the same launch: one warp
 * per (row, 128 columns), each value computed as cu_swiglu computes it, the bytes as cu_mma_pack_act packs them. */
void cu_swiglu_pack(cu_stream st, int official, float *g, const float *v, const float *w, int rows, int I, float limit, uint8_t *q,
                    int ldq, float *qs, int lds);

/* ---- sampling (core/sample.h) ---------------------------------------------------------------------------------- */

/* One row to draw a token from, with its parameters (dsv4_sampling) and draw number. */
typedef struct {
    int32_t row;               /* the row of `logits` */
    int32_t top_k, n_allowed;
    float temperature, top_p, min_p;
    uint64_t seed, draw;
} cu_sample_req;
/* tok[q] = the token core/sample.h draws from logits row req[q].row (req, tok: device arrays of n), and, when probs
 * is not NULL, probs[q][V] = the distribution it draws from (sample.c sample_distribution, bit for bit). One block
 * of SM_LANES threads per request; w: scratch [n][V]. Reductions (k_sample.cu): argmaxes over the total order
 * (value desc, id asc), integer counts, and the definition's lane tree sum (thread t = lane t, ids in increasing
 * order, then a fixed shared-memory tree): the CPU's sums, bit for bit. A row never depends on the others. */
void cu_sample(cu_stream st, const float *logits, int V, const cu_sample_req *req, int n, float *w, int32_t *tok, float *probs);

/* ---- the DSpark drafter's heads (core/dspark.c dsv4_dspark_markov, dsv4_dspark_confidence) ------------------------ */

/* Draft row j: cat[0..d) = y (the row's hc_head output), cat[d..d+rank) = e = bf16_if(markov_w1[ids[j]]) (the
 * previous draft token's Markov embedding; ids lives on the device, so the previous draw needs no host trip).
 * Elementwise: exact. */
void cu_dspark_markov_in(cu_stream st, int official, const dsv4_weight *w1, const int32_t *ids, int j, const float *y, int d,
                         int rank, float *cat);
/* row[v] += add[v] for v < n (one rounding each: the CPU's U_row[v] += scratch[v]). */
void cu_add_row(cu_stream st, float *row, const float *add, int n);

#ifdef __cplusplus
}
#endif
#endif
