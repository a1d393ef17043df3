/* The tiny checkpoint the model-level targets share (checkpoint, state, prefix cache), written by the engine's
 * own official-format writer (model/tiny.c). Small enough that a load or a state round trip takes
 * microseconds, yet it has every layer kind: window-only, ratio 4 (compressor + indexer) and ratio 128. The seed
 * corpora of those targets are made from this same fixture (tests/fuzz/make_corpus.c): change it and regenerate
 * them, or their states stop matching the model's fingerprint. */
#include "../fuzz.h"
#include "model/tiny.h"
#include <stdio.h>
#include <stdlib.h>

static const char *const SETS[] = {
    "vocab_size=64", "hidden_size=32", "num_hidden_layers=3", "compress_ratios=[0,4,128]",
    "num_attention_heads=2", "head_dim=32", "qk_rope_head_dim=16", "q_lora_rank=16", "o_lora_rank=16",
    "o_groups=1", "sliding_window=4", "index_n_heads=2", "index_head_dim=16", "index_topk=2",
    "moe_intermediate_size=32", "n_routed_experts=2", "num_experts_per_tok=1", "num_hash_layers=1", "hc_mult=2",
};

int fuzz_tiny_write_mtp(const char *dir, int n_shards, int mtp, dsv4_error *err) {
    dsv4_tiny_opts o = { .preset = "flash-tiny", .seed = 7, .sets = SETS, .n_sets = (int)(sizeof SETS / sizeof *SETS),
                         .mtp = (dsv4_mtp_kind)mtp, .n_shards = n_shards };
    return dsv4_tiny_write(dir, &o, err);
}

int fuzz_tiny_write(const char *dir, int n_shards, dsv4_error *err) { return fuzz_tiny_write_mtp(dir, n_shards, MTP_NONE, err); }

dsv4_model *fuzz_tiny_model(const char *dir, int kv_format) {
    dsv4_load_opts o = { .mode = DSV4_MODE_EXACT, .n_threads = 1, .quiet = 1, .kv_format = kv_format };
    dsv4_model *m;
    dsv4_error err;
    if (dsv4_model_load(dir, &o, &m, &err)) {
        fprintf(stderr, "fuzz: fixture model %s: %s\n", dir, err.msg);
        abort();
    }
    return m;
}

void fuzz_tiny_state(dsv4_model *m, int n, void **buf, size_t *len) {
    dsv4_seq *s;
    dsv4_error err;
    int32_t tok[256];
    if (n > 256) abort();
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 7 + 3) % 64);
    if (dsv4_seq_new(m, &s, &err)) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
    dsv4_step_item it = { .seq = s, .tokens = tok, .n_tokens = n, .want = DSV4_LOGITS_NONE };
    if ((n && dsv4_step(m, &it, 1, &err)) || dsv4_seq_save_mem(s, buf, len, &err)) {
        fprintf(stderr, "fuzz: fixture state: %s\n", err.msg);
        abort();
    }
    dsv4_seq_free(s);
}
