// Token ids in, logits out, for a llama.cpp / ik_llama.cpp GGUF: the check that a converted DeepSeek V4 model
// computes what dsv4 computes (tools/bench/llamacpp_compare.sh). The synthetic checkpoints have no tokenizer, so
// neither llama-cli nor llama-simple can feed them; this feeds ids straight to llama_decode.
//
//   llamacpp_logits MODEL.gguf IDS OUT.npy [N_GEN] [THREADS] [FLASH_ATTN 0|1]
//
// IDS is a comma-separated list. The prompt is decoded as one batch with logits at every position, written to
// OUT.npy as float32 [positions, vocab] (the layout of `dsv4 logits --out`); then N_GEN tokens are decoded greedily
// one at a time (argmax, lowest id on ties, as dsv4 generate --temp 0) and their ids printed on one line.
// Built against the tree's include/ and libllama by llamacpp_compare.sh; it is our code, not llama.cpp's.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static bool write_npy(const char *path, const std::vector<float> &a, int rows, int cols) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    char hdr[128];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows, cols);
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    std::string h(hdr, n);
    h.append(pad, ' ');
    h.push_back('\n');
    unsigned short hl = (unsigned short)h.size();
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fwrite(&hl, 2, 1, f);
    fwrite(h.data(), 1, h.size(), f);
    fwrite(a.data(), sizeof(float), a.size(), f);
    return fclose(f) == 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS OUT.npy [N_GEN] [THREADS] [FLASH_ATTN]\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> ids;
    for (char *s = argv[2]; *s;) {
        ids.push_back((llama_token)strtol(s, &s, 10));
        if (*s == ',') s++;
    }
    const int n_gen = argc > 4 ? atoi(argv[4]) : 8;
    const int threads = argc > 5 ? atoi(argv[5]) : 2;
    const bool fa = argc > 6 ? atoi(argv[6]) != 0 : true;

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.flash_attn = fa;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int nv = llama_n_vocab(model);

    const int P = (int)ids.size();
    llama_batch b = llama_batch_init(P, 0, 1);
    for (int i = 0; i < P; i++) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = P;
    if (llama_decode(ctx, b)) return 1;
    std::vector<float> all((size_t)P * nv);
    printf("prompt argmax:");
    for (int i = 0; i < P; i++) {
        const float *l = llama_get_logits_ith(ctx, i);
        memcpy(&all[(size_t)i * nv], l, sizeof(float) * nv);
        printf(" %d", argmax(l, nv));
    }
    printf("\n");
    if (!write_npy(argv[3], all, P, nv)) return 1;
    llama_batch_free(b);

    llama_token next = argmax(&all[(size_t)(P - 1) * nv], nv);
    printf("greedy:");
    for (int g = 0; g < n_gen; g++) {
        printf(" %d", next);
        fflush(stdout);
        llama_batch one = llama_batch_init(1, 0, 1);
        one.token[0] = next;
        one.pos[0] = P + g;
        one.n_seq_id[0] = 1;
        one.seq_id[0][0] = 0;
        one.logits[0] = 1;
        one.n_tokens = 1;
        if (llama_decode(ctx, one)) return 1;
        next = argmax(llama_get_logits_ith(ctx, 0), nv);
        llama_batch_free(one);
    }
    printf("\n");
    llama_free(ctx);
    llama_free_model(model);
    return 0;
}
