/* Only for building tests/gpu/test_gpu_attention.c with -DATT_TEST_EMULATE on a machine without a GPU: the
 * "device" is host memory and cu_attention a C port of k_attention.cu's chunked kernels (ATT_CHUNKED 1), in their
 * float order (fmaf dots over the columns in order, chunks of 64 keys, one max, per-chunk denominator and P.V
 * parts, added in chunk order). It is how the test's tolerances were measured before the first GPU run; it is not
 * the code under test and the GPU test never uses it. Build (from the repository root, after `make`):
 *   cc -O2 -DATT_TEST_EMULATE -Iinclude -Isrc -Itests/gpu tests/gpu/test_gpu_attention.c build/libdsv4.a \
 *      -lcmocka -ljansson -lpcre2-8 -lxxhash -lmicrohttpd -lm -pthread -o /tmp/att_emulated && /tmp/att_emulated */
#ifndef DSV4_EMULATE_ATTENTION_H
#define DSV4_EMULATE_ATTENTION_H

static void *dev_put(const void *h, size_t n) {
    void *d = calloc(1, n ? n : 1);
    assert_non_null(d);
    if (n && h) memcpy(d, h, n);
    return d;
}
static void dev_get(void *h, const void *d, size_t n) { memcpy(h, d, n); }
static void dev_free(void *d) { free(d); }
static void dev_sync(void) {}

#ifndef ATT_TEST_SHIM   /* with the shim (tools/gpu/shim/shim_attention.sh) cu_attention is k_attention.cu's own */
#define EMU_KC 64

int64_t cu_attention_scratch_floats(int T, int H, int D, int64_t max_keys) {
    (void)T;
    const int64_t nch = (max_keys + EMU_KC - 1) / EMU_KC;
    return nch * H * (EMU_KC + 2 + (int64_t)D) + H;
}

int cu_attention_decode_launches(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats) {
    (void)official; (void)mma; (void)lay; (void)T; (void)H; (void)D; (void)max_keys; (void)scratch_floats;
    return 0;   /* the C port has one order and no kernels */
}

int cu_attention_fused_launches(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats) {
    (void)official; (void)mma; (void)lay; (void)T; (void)H; (void)D; (void)max_keys; (void)scratch_floats;
    return 0;
}

int cu_attention(cu_stream st, int official, int mma, cu_kvlay lay, const float *q, const uint8_t *kvs, const int64_t *pos,
                 const int32_t *item_of, const cu_item *items, const cu_seq_layer *sl, int ring_len, int Wn, int ratio,
                 const int32_t *sel, const int32_t *n_sel, int topk, const float *sink, const float *freq, int T, int H,
                 int D, int R, int max_keys, float *scratch, int64_t scratch_floats, unsigned *bar, float *o) {
    (void)st; (void)scratch; (void)scratch_floats; (void)max_keys; (void)bar;
    (void)mma;   /* the fp32 path's order only: the tensor-core path runs through the shim */
    kv_layout kl;
    kv_layout_init(&kl, lay.fmt, (kv_row_kind)lay.kind, lay.width, lay.rope);
    const float scale = 1.0f / sqrtf((float)D);
    for (int t = 0; t < T; t++) {
        const int64_t p = pos[t], w0 = p - Wn + 1 < 0 ? 0 : p - Wn + 1;
        const int nwin = (int)(p - w0 + 1);
        const int nk = nwin + (ratio == 128 ? (int)((p + 1) / 128) : ratio == 4 ? n_sel[t] : 0);
        const cu_item it = items[item_of[t]];
        const cu_seq_layer L = sl[item_of[t]];
        float *keys = malloc(sizeof(float) * (size_t)nk * D), *s = malloc(sizeof(float) * (size_t)nk * H);
        for (int i = 0; i < nk; i++) {
            const uint8_t *row;
            if (i < nwin) {
                const int64_t x = w0 + i;
                row = x >= it.p0 ? kvs + (int64_t)(it.first + (x - it.p0)) * lay.bytes : L.ring + (x % ring_len) * lay.bytes;
            } else {
                row = L.crows + (int64_t)(ratio == 128 ? i - nwin : sel[(int64_t)t * topk + i - nwin]) * lay.bytes;
            }
            kv_decode(&kl, row, keys + (int64_t)i * D);
        }
        const int nch = (nk + EMU_KC - 1) / EMU_KC;
        for (int h = 0; h < H; h++) {
            const float *qh = q + ((int64_t)t * H + h) * D;
            float M = -INFINITY;
            for (int i = 0; i < nk; i++) {
                float acc = 0.0f;
                for (int j = 0; j < D; j++) acc = fmaf(qh[j], keys[(int64_t)i * D + j], acc);
                s[(int64_t)h * nk + i] = acc * scale;
                M = fmaxf(M, acc * scale);
            }
            float den = expf(sink[h] - M), out[4096], a[4096];
            for (int j = 0; j < D; j++) a[j] = 0.0f;
            for (int c = 0; c < nch; c++) {
                float pden = 0.0f, part[4096];
                for (int j = 0; j < D; j++) part[j] = 0.0f;
                for (int i = c * EMU_KC; i < nk && i < (c + 1) * EMU_KC; i++) {
                    const float e = expf(s[(int64_t)h * nk + i] - M), pe = official ? round_bf16(e) : e;
                    pden += e;
                    for (int j = 0; j < D; j++) part[j] = fmaf(pe, keys[(int64_t)i * D + j], part[j]);
                }
                den += pden;
                for (int j = 0; j < D; j++) a[j] += part[j];
            }
            const float inv = 1.0f / den;
            for (int j = 0; j < D; j++) out[j] = official ? round_bf16(a[j] * inv) : a[j] * inv;
            for (int i = 0; i < R / 2; i++) {
                const float theta = (float)p * freq[i], cs = cosf(theta), sn = -sinf(theta);
                float *x = out + D - R + 2 * i;
                const float re = x[0], im = x[1];
                x[0] = official ? round_bf16(re * cs - im * sn) : re * cs - im * sn;
                x[1] = official ? round_bf16(re * sn + im * cs) : re * sn + im * cs;
            }
            memcpy(o + ((int64_t)t * H + h) * D, out, sizeof(float) * (size_t)D);
        }
        free(keys);
        free(s);
    }
    return 0;
}
#endif
#endif
