// A small llama.cpp / ik_llama.cpp driver for tools/bench/llamacpp_compare.sh (issue 17): our code, built against
// the tree's include/ and libllama (not llama-bench: that pulls in the `common` library, 24 more files, an hour of
// compiling on a shared 2-core box). Two jobs:
//
//   llamacpp_run check MODEL.gguf IDS OUT.npy [N_GEN] [THREADS] [FLASH_ATTN] [RTR]
//     IDS is a comma-separated list (the synthetic checkpoints have no tokenizer). The prompt is decoded as one batch
//     with logits at every position, written to OUT.npy as float32 [positions, vocab] (the layout of
//     `dsv4 logits --out`); then N_GEN tokens are decoded greedily one at a time (argmax, lowest id on ties, as
//     `dsv4 generate --temp 0`) and their ids printed.
//
//   llamacpp_run bench MODEL.gguf PP TG REPS THREADS FLASH_ATTN FMOE RTR
//     llama-bench's method, step for step (examples/llama-bench: test_prompt, test_gen, the -gp test kind): a warmup
//     of one prompt token and one generated token; then REPS times: clear the cache, decode PP random tokens as one
//     batch (timed: "pp"), then TG random tokens one at a time after them (timed apart: "tg at depth PP", llama-bench
//     -gp PP,TG). Context parameters as llama-bench's defaults (n_batch 2048, n_ubatch 512, f16 KV cache, mla 3,
//     graph reuse, fused up/gate, only active experts), flash attention, fused MoE and run-time repacking from the
//     arguments. Prints one line per rep: "rep I pp TOK/S tg TOK/S".
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <chrono>
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

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static int bench(int argc, char **argv) {
    if (argc < 10) {
        fprintf(stderr, "usage: %s bench MODEL.gguf PP TG REPS THREADS FLASH_ATTN FMOE RTR\n", argv[0]);
        return 2;
    }
    const int pp = atoi(argv[3]), tg = atoi(argv[4]), reps = atoi(argv[5]), threads = atoi(argv[6]);
    const bool fa = atoi(argv[7]) != 0, fmoe = atoi(argv[8]) != 0, rtr = atoi(argv[9]) != 0;
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.use_mmap = true;
    mp.repack_tensors = rtr;
    mp.mla = 3;
    llama_model *model = llama_model_load_from_file(argv[2], mp);
    if (!model) return 1;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = pp + tg;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.type_k = cp.type_v = GGML_TYPE_F16;
    cp.flash_attn = fa;
    cp.mla_attn = 3;
    cp.graph_reuse = true;
    cp.fused_moe_up_gate = fmoe;
    cp.fused_up_gate = true;
    cp.only_active_experts = true;
    cp.min_experts = -1;
    cp.thresh_experts = 0.0f;
    cp.n_threads = cp.n_threads_batch = threads;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int nv = llama_n_vocab(model);
    auto prompt = [&](int n) {
        std::vector<llama_token> t(n);
        for (int i = 0; i < n; i++) t[i] = std::rand() % nv;
        llama_decode(ctx, llama_batch_get_one(t.data(), n, 0, 0));
        llama_synchronize(ctx);
    };
    auto gen = [&](int n, int past) {
        llama_token t = std::rand() % nv;
        for (int i = 0; i < n; i++) {
            llama_decode(ctx, llama_batch_get_one(&t, 1, past + i, 0));
            llama_synchronize(ctx);
            t = std::rand() % nv;
        }
    };
    llama_kv_cache_clear(ctx);
    prompt(1);
    gen(1, 0);
    for (int r = 0; r < reps; r++) {
        llama_kv_cache_clear(ctx);
        double t0 = now_s();
        prompt(pp);
        double t1 = now_s();
        gen(tg, pp);
        double t2 = now_s();
        printf("rep %d pp %.3f tg %.3f\n", r, pp / (t1 - t0), tg / (t2 - t1));
        fflush(stdout);
    }
    llama_free(ctx);
    llama_free_model(model);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "bench")) return bench(argc, argv);
    if (argc < 5 || strcmp(argv[1], "check")) {
        fprintf(stderr, "usage: %s check MODEL.gguf IDS OUT.npy [N_GEN] [THREADS] [FLASH_ATTN] [RTR]\n"
                        "       %s bench MODEL.gguf PP TG REPS THREADS FLASH_ATTN FMOE RTR\n", argv[0], argv[0]);
        return 2;
    }
    argc--;
    argv++;
    std::vector<llama_token> ids;
    for (char *s = argv[2]; *s;) {
        ids.push_back((llama_token)strtol(s, &s, 10));
        if (*s == ',') s++;
    }
    const int n_gen = argc > 4 ? atoi(argv[4]) : 8;
    const int threads = argc > 5 ? atoi(argv[5]) : 2;
    const bool fa = argc > 6 ? atoi(argv[6]) != 0 : true;
    const bool rtr = argc > 7 ? atoi(argv[7]) != 0 : false;

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.repack_tensors = rtr;
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
