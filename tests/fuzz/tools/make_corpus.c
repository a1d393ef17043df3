/* Writes the seed corpora of the fuzz targets: `make fuzz-corpus` (build/fuzz-tools/make_corpus tests/fuzz/corpus).
 * Seeds are small real examples: files of the tiny fixture checkpoint (lib/tiny_fixture.c), states it saved,
 * the text test data (tests/data/text), and a few hand-written edge cases. Each seed carries the selector
 * byte its target expects (see the target's header comment). Deterministic: rerunning rewrites the same bytes. */
#include "../fuzz.h"
#include "model/safetensors.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

static const char *out_root;

/* Write out_root/target/name = prefix bytes (np of them) + data. */
static void seed(const char *target, const char *name, const void *prefix, size_t np, const void *data, size_t n) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", out_root, target);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", out_root, target, name);
    char *buf = malloc(np + n + 1);
    if (np) memcpy(buf, prefix, np);
    if (n) memcpy(buf + np, data, n);
    fuzz_write_file(path, buf, np + n);
    free(buf);
}
static void seed_str(const char *target, const char *name, const char *s) { seed(target, name, NULL, 0, s, strlen(s)); }
static void seed_sel(const char *target, const char *name, uint8_t sel, const void *data, size_t n) {
    seed(target, name, &sel, 1, data, n);
}
static char *read_in(const char *dir, const char *name, size_t *n) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fuzz_read_file(path, n);
}

/* The fixture's files: configs, shards, index, checkpoint headers. */
static void model_files(const char *ck1, const char *ck2) {
    size_t n, m;
    char *cfg = read_in(ck1, "config.json", &n);
    seed("config", "hf-fixture.json", NULL, 0, cfg, n);
    free(cfg);
    /* checkpoint seeds: the config and the header of each fixture (selector: bit 0 config, bits 1-2 fixture) */
    static const char *const kinds[3] = {"plain", "mtp", "dspark"};
    for (int k = 0; k < 3; k++) {
        char dir[4400], name[64];
        dsv4_error err;
        snprintf(dir, sizeof dir, "%s/ck-%s", fuzz_tmpdir(), kinds[k]);
        if (fuzz_tiny_write_mtp(dir, 1, k, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
        cfg = read_in(dir, "config.json", &n);
        snprintf(name, sizeof name, "config-%s", kinds[k]);
        seed_sel("checkpoint", name, (uint8_t)(1 | k << 1), cfg, n);
        if (k == 2) seed("config", "hf-fixture-dspark.json", NULL, 0, cfg, n);
        free(cfg);
        char *shard = read_in(dir, "model-00001-of-00001.safetensors", &n);
        uint64_t hlen;
        memcpy(&hlen, shard, 8);
        snprintf(name, sizeof name, "header-%s", kinds[k]);
        seed_sel("checkpoint", name, (uint8_t)(k << 1), shard + 8, (size_t)hlen);
        free(shard);
    }
    char *idx = read_in(ck2, "model.safetensors.index.json", &m);
    seed("st_index", "index-fixture.json", NULL, 0, idx, m);
    free(idx);
    seed_str("st_index", "index-one-tensor.json",
             "{\"metadata\":{},\"weight_map\":{\"embed.weight\":\"model-00001-of-00002.safetensors\"}}");
    seed_str("st_index", "index-missing-shard.json", "{\"weight_map\":{\"embed.weight\":\"model-00009-of-00009.safetensors\"}}");
}

/* Small hand-made safetensors files: every dtype name, 0-d and 4-d shapes, metadata, an empty tensor. */
static void safetensors_files(void) {
    static const char *const headers[] = {
        "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[8,12]},\"c\":{\"dtype\":\"F8_E8M0\",\"shape\":[1,1],"
        "\"data_offsets\":[12,13]},\"d\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[13,16]}}",
        "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},\"e\":{\"dtype\":\"I64\",\"shape\":[0],"
        "\"data_offsets\":[4,4]},\"q\":{\"dtype\":\"U8\",\"shape\":[1,1,2,2],\"data_offsets\":[4,8]},\"h\":{\"dtype\":"
        "\"F16\",\"shape\":[2],\"data_offsets\":[8,12]},\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
        "{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},\"y\":{\"dtype\":\"I16\",\"shape\":[2],"
        "\"data_offsets\":[8,12]},\"z\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[12,16]}}",
    };
    for (size_t i = 0; i < sizeof headers / sizeof *headers; i++) {
        size_t hl = strlen(headers[i]);
        uint64_t h = hl;
        char buf[1024];
        memcpy(buf, &h, 8);
        memcpy(buf + 8, headers[i], hl);
        for (int k = 0; k < 16; k++) buf[8 + hl + k] = (char)(k * 37 + 1);
        char name[32];
        snprintf(name, sizeof name, "small-%zu.safetensors", i);
        seed("safetensors", name, NULL, 0, buf, 8 + hl + 16);
    }
}

/* The official inference/config.json spelling of the fixture's config (model/config.c's second names). */
/* The configs of the transformers-conformance checkpoints (tests/data/hf): real HF files. */
static void hf_configs(const char *root) {
    static const char *const names[] = {"flash5", "pro4"};
    for (int i = 0; i < 2; i++) {
        char dir[4300], name[64];
        size_t n;
        snprintf(dir, sizeof dir, "%s/tests/data/hf/%s/checkpoint", root, names[i]);
        char *cfg = read_in(dir, "config.json", &n);
        snprintf(name, sizeof name, "hf-%s.json", names[i]);
        seed("config", name, NULL, 0, cfg, n);
        free(cfg);
    }
}

static void official_config(void) {
    seed_str("config", "official-fixture.json",
             "{\"vocab_size\": 64, \"dim\": 32, \"n_layers\": 3, \"n_mtp_layers\": 0, \"n_heads\": 2, \"head_dim\": 32,"
             " \"rope_head_dim\": 16, \"q_lora_rank\": 16, \"o_groups\": 1, \"o_lora_rank\": 16, \"window_size\": 4,"
             " \"n_routed_experts\": 2, \"n_activated_experts\": 1, \"n_shared_experts\": 1, \"moe_inter_dim\": 32,"
             " \"n_hash_layers\": 1, \"route_scale\": 1.5, \"swiglu_limit\": 10.0, \"norm_eps\": 1e-6, \"hc_mult\": 2,"
             " \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-6, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
             " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1,"
             " \"index_n_heads\": 2, \"index_head_dim\": 16, \"index_topk\": 2, \"max_seq_len\": 4096,"
             " \"compress_ratios\": [0, 4, 128], \"expert_dtype\": \"fp4\", \"dtype\": \"fp8\"}");
    seed_str("config", "dspark-lists-stages.json",
             "{\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_nextn_predict_layers\": 1,"
             " \"num_attention_heads\": 2, \"q_lora_rank\": 16, \"o_lora_rank\": 16, \"head_dim\": 32,"
             " \"qk_rope_head_dim\": 16, \"n_routed_experts\": 2, \"num_experts_per_tok\": 1,"
             " \"moe_intermediate_size\": 32, \"index_head_dim\": 16, \"compress_ratios\": [4, 128, 0, 0, 0],"
             " \"dspark_block_size\": 4, \"dspark_markov_rank\": 8, \"dspark_target_layer_ids\": [0, 1],"
             " \"rope_scaling\": {\"factor\": 4, \"original_max_position_embeddings\": 1024}}");
}

static void states(dsv4_model *const m[3]) {
    static const int lens[] = {0, 1, 3, 5, 6, 9, 13};
    static const char *const fmt[3] = {"f32", "bf16", "fp8"};
    for (int f = 0; f < 3; f++)
        for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
            if (f && lens[i] != 1 && lens[i] != 9) continue;   /* other formats: two lengths suffice */
            void *buf;
            size_t n;
            fuzz_tiny_state(m[f], lens[i], &buf, &n);
            char name[48];
            snprintf(name, sizeof name, "%s-pos-%d.dsv4seq", fmt[f], lens[i]);
            seed("state", name, NULL, 0, buf, n);
            seed("state_sum", name, NULL, 0, buf, n);
            if (f == 0 && (lens[i] == 5 || lens[i] == 6)) {
                snprintf(name, sizeof name, "pos-%d-raw", lens[i]);
                seed_sel("prefix_disk", name, 0, buf, n);
                snprintf(name, sizeof name, "pos-%d-fixsum", lens[i]);
                seed_sel("prefix_disk", name, 1, buf, n);
            }
            free(buf);
        }
}

/* The prefix_disk target stores the first 6 tokens of {3, 10, 17, ...}: the fixture's state of 6 tokens
 * (fuzz_tiny_state uses the same token rule (i * 7 + 3) % 64), so seed pos-6 is a hit. */

/* Its companion inputs (selector bit 1; bit 2 DSpark): the drafter states a speculating stream stores beside the
 * state of those 6 tokens, on the fixture with a V4 MTP head and with a DSpark drafter — hits as they are. */
static void drafter_states(void) {
    static const int32_t request[7] = { 3, 10, 17, 24, 31, 38, 45 };
    static const char *const kind[2] = { "mtp", "dspark" };
    for (int k = 0; k < 2; k++) {
        char ck[4300], dir[4300], cmd[9000];
        dsv4_error err;
        snprintf(ck, sizeof ck, "%s/ck-%s", fuzz_tmpdir(), kind[k]);
        snprintf(dir, sizeof dir, "%s/fill-%s", fuzz_tmpdir(), kind[k]);
        if (fuzz_tiny_write_mtp(ck, 1, k ? 2 : 1, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
        dsv4_model *m = fuzz_tiny_model(ck, DSV4_KV_F32);
        fuzz_spec_cache_fill(m, kind[k], request, 7, dir);
        dsv4_model_free(m);
        snprintf(cmd, sizeof cmd, "ls %s/*.%s.dsv4comp", dir, kind[k]);
        FILE *p = popen(cmd, "r");
        char path[4400] = "";
        if (!p || !fgets(path, sizeof path, p)) { fprintf(stderr, "no %s drafter state in %s\n", kind[k], dir); exit(1); }
        pclose(p);
        path[strcspn(path, "\n")] = 0;
        size_t n;
        char *buf = fuzz_read_file(path, &n);
        char name[48];
        snprintf(name, sizeof name, "%s-companion-raw", kind[k]);
        seed_sel("prefix_disk", name, (uint8_t)(2 | 4 * k), buf, n);
        snprintf(name, sizeof name, "%s-companion-fixsum", kind[k]);
        seed_sel("prefix_disk", name, (uint8_t)(3 | 4 * k), buf, n);
        free(buf);
        fuzz_rmtree(dir);
    }
}

static void text_files(const char *data_dir) {
    size_t n;
    char *tok = read_in(data_dir, "tiny_tokenizer.json", &n);
    seed("tokenizer_load", "tiny.json", NULL, 0, tok, n);
    static const char cfg[] = "{\"add_bos_token\": true, \"bos_token\": \"<X>\", \"eos_token\": {\"content\": \"<XY>\"}}";
    char *both = malloc(n + 1 + sizeof cfg);
    memcpy(both, tok, n);
    both[n] = 0;
    memcpy(both + n + 1, cfg, sizeof cfg - 1);
    seed("tokenizer_load", "tiny-with-config", NULL, 0, both, n + sizeof cfg);
    free(both);
    free(tok);
    /* encode: the texts of the tokenizer vectors (plain and with added tokens), decode: their first ids */
    char path[4400];
    snprintf(path, sizeof path, "%s/vectors.jsonl", data_dir);
    FILE *f = fopen(path, "r");
    char line[8192];
    for (int i = 0; f && fgets(line, sizeof line, f) && i < 12; i++) {
        json_t *j = json_loads(line, 0, NULL);
        const char *text = json_string_value(json_object_get(j, "text"));
        if (text) {
            char name[32];
            snprintf(name, sizeof name, "vector-%02d", i);
            seed_sel("encode", name, (uint8_t)(i & 1), text, strlen(text));
            uint8_t ids[64];
            size_t k = 0;
            for (size_t c = 0; text[c] && k + 2 <= sizeof ids; c++) { ids[k++] = (uint8_t)text[c]; ids[k++] = 0; }
            seed("decode", name, NULL, 0, ids, k);   /* byte-valued ids: the byte alphabet, then merges */
        }
        json_decref(j);
    }
    if (f) fclose(f);
    seed_sel("encode", "added-tokens", 0, "<X><XY><XYZ>x<X", 15);
    seed_sel("encode", "bad-utf8", 0, "ok \xc3\x28 \xed\xa0\x80", 9);
    static const uint8_t edge_ids[] = {0, 0, 5, 1, 6, 1, 7, 1, 255, 255, 0xe4, 0, 0xbd, 0, 1, 1};
    seed("decode", "edges", NULL, 0, edge_ids, sizeof edge_ids);
    /* chat: the published requests (selector 0) and their messages arrays (selector 1 | thinking) */
    for (int i = 1; i <= 4; i++) {
        char name[64];
        snprintf(name, sizeof name, "chat_encoding/published_%d.json", i);
        char *req = read_in(data_dir, name, &n);
        snprintf(name, sizeof name, "published-%d-request", i);
        seed_sel("chat_render", name, 0, req, n);
        json_t *j = json_loads(req, 0, NULL);
        char *msgs = json_dumps(json_object_get(j, "messages"), JSON_COMPACT);
        snprintf(name, sizeof name, "published-%d-messages", i);
        if (msgs) seed_sel("chat_render", name, (uint8_t)(1 | 2 | (i & 1) << 4), msgs, strlen(msgs));
        free(msgs);
        json_decref(j);
        free(req);
        /* the rendered prompts hold real assistant output, DSML tool calls included */
        snprintf(name, sizeof name, "chat_encoding/published_%d.txt", i);
        char *txt = read_in(data_dir, name, &n);
        snprintf(name, sizeof name, "published-%d", i);
        seed_sel("dsml", name, (uint8_t)(i & 1), txt, n);
        free(txt);
    }
}

#define D "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"
#define EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

static void dsml_files(void) {
    static const char calls[] =
        "Let me check.</think>Checking now.\n\n<" D "tool_calls>\n<" D "invoke name=\"get_weather\">\n<" D
        "parameter name=\"location\" string=\"true\">Bei\"jing\n</" D "parameter>\n<" D "parameter name=\"opts\" "
        "string=\"false\">{\"units\": [\"c\", {\"deep\": [1, 2.5, null]}], \"n\": 3}</" D "parameter>\n</" D "invoke>\n<"
        D "invoke name=\"ping\">\n\n</" D "invoke>\n</" D "tool_calls>" EOS;
    seed_sel("dsml", "two-calls-thinking", 1, calls, sizeof calls - 1);
    static const char plain[] = "Just an answer with a < and a </think> inside." EOS;
    seed_sel("dsml", "content-eos", 0, plain, sizeof plain - 1);
    static const char truncated[] = "thinking...\n\n<" D "tool_calls>\n<" D "invoke name=\"a\">\n<" D "parameter name=\"k\"";
    seed_sel("dsml", "truncated", 0, truncated, sizeof truncated - 1);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: make_corpus OUT_DIR (tests/fuzz/corpus)\n"); return 2; }
    out_root = argv[1];
    mkdir(out_root, 0755);
    const char *root = getenv("DSV4_ROOT");
    char data_dir[4200], ck1[4300], ck2[4300];
    snprintf(data_dir, sizeof data_dir, "%s/tests/data/text", root && *root ? root : ".");
    snprintf(ck1, sizeof ck1, "%s/ck1", fuzz_tmpdir());
    snprintf(ck2, sizeof ck2, "%s/ck2", fuzz_tmpdir());
    dsv4_error err;
    if (fuzz_tiny_write(ck1, 1, &err) || fuzz_tiny_write(ck2, 2, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    model_files(ck1, ck2);
    safetensors_files();
    official_config();
    hf_configs(root && *root ? root : ".");
    dsv4_model *m[3];
    for (int f = 0; f < 3; f++) m[f] = fuzz_tiny_model(ck1, f);
    states(m);
    for (int f = 0; f < 3; f++) dsv4_model_free(m[f]);
    drafter_states();
    text_files(data_dir);
    dsml_files();
    printf("seeds written under %s\n", out_root);
    return 0;
}
