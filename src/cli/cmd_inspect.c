/* dsv4 inspect -m DIR
 * Prints a checkpoint's config, tensor inventory, weight memory, KV-cache cost per context token and detected
 * speculative heads, then validates it: the shards and index (st_open_dir), every tensor's presence, dtype and
 * shape (dsv4_inventory_check), the index covering every stored tensor, scale bytes and tid2eid tables.
 * Exit 0 when the checkpoint is usable, 1 with a one-line message on stderr otherwise. */
#include "cli/cli.h"
#include "state/kvrows.h"
#include "model/config.h"
#include "model/expert_place.h"
#include "model/expert_profile.h"
#include "model/model.h"
#include "model/inventory.h"
#include "model/safetensors.h"
#include "util/error.h"
#include "util/fileio.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *layer_type(int ratio) { return ratio == 0 ? "SWA" : ratio == 4 ? "CSA" : "HCA"; }

static void human_bytes(char *buf, size_t n, double b) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) { b /= 1024.0; u++; }
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
}

static void print_config(const dsv4_config *c) {
    int n_type[3] = {0, 0, 0};
    for (int L = 0; L < c->n_layers; L++) n_type[c->compress_ratio[L] == 0 ? 0 : c->compress_ratio[L] == 4 ? 1 : 2]++;
    printf("config\n");
    printf("  vocab %d, hidden %d, %d layers (SWA %d, CSA %d, HCA %d), %d speculative stage(s) in config\n",
           c->vocab_size, c->dim, c->n_layers, n_type[0], n_type[1], n_type[2], c->n_mtp);
    printf("  layers:");
    for (int L = 0; L < c->n_layers; L++)
        printf(" %d:%s%s", L, layer_type(c->compress_ratio[L]), L < c->n_hash ? "/hash" : "");
    printf("\n");
    printf("  attention: %d heads x %d (rope %d), q_lora %d, o_groups %d x o_lora %d, window %d\n", c->n_heads,
           c->head_dim, c->rope_dim, c->q_lora, c->o_groups, c->o_lora, c->window);
    printf("  indexer: %d heads x %d, top-k %d\n", c->index_n_heads, c->index_head_dim, c->index_topk);
    printf("  moe: %d routed experts (top-%d, %s) + %d shared, inter %d, %d hash layer(s), route scale %g, "
           "swiglu limit %g\n", c->n_routed, c->n_act, c->expert_fp4 ? "fp4" : "fp8", c->n_shared, c->moe_inter,
           c->n_hash, c->route_scale, c->swiglu_limit);
    printf("  mhc: %d streams, sinkhorn %d iters, eps %g; rms eps %g\n", c->hc_mult, c->hc_iters, c->hc_eps,
           c->norm_eps);
    printf("  rope: theta %g, compressed theta %g, yarn %s (factor %g, original %lld, beta %g/%g)\n",
           c->rope_theta, c->compress_rope_theta, c->original_seq_len > 0 ? "on" : "off", c->rope_factor,
           (long long)c->original_seq_len, c->beta_fast, c->beta_slow);
    printf("  max positions %lld, bos %d, eos %d\n", (long long)c->max_position, c->bos_id, c->eos_id);
    if (c->dspark_markov_rank > 0) {
        printf("  dspark: block %d, noise token %d, markov rank %d, target layers", c->dspark_block_size,
               c->dspark_noise_token, c->dspark_markov_rank);
        for (int i = 0; i < c->n_dspark_targets; i++) printf(" %d", c->dspark_target_layers[i]);
        printf("\n");
    }
}

/* Speculative heads are recognised by their distinctive tensors (spec §2.4). */
static dsv4_mtp_kind detect_spec_heads(const st_archive *a) {
    if (st_find(a, "mtp.0.main_proj.weight")) return MTP_DSPARK;
    if (st_find(a, "mtp.0.e_proj.weight")) return MTP_V4;
    return MTP_NONE;
}

static int spec_stages(const dsv4_config *c, dsv4_mtp_kind k) {
    return k == MTP_V4 ? 1 : k == MTP_DSPARK ? c->n_mtp : 0;
}

static void print_tensors(const st_archive *a) {
    int64_t count[ST_N_DTYPES] = {0};
    double bytes[ST_N_DTYPES] = {0}, total = 0;
    for (int i = 0; i < a->n_tensors; i++) {
        count[a->tensors[i].dtype]++;
        bytes[a->tensors[i].dtype] += (double)a->tensors[i].nbytes;
        total += (double)a->tensors[i].nbytes;
    }
    char hb[32];
    printf("tensors: %d in %d file(s)\n", a->n_tensors, a->n_shards);
    for (int d = 0; d < ST_N_DTYPES; d++) {
        if (!count[d]) continue;
        human_bytes(hb, sizeof hb, bytes[d]);
        printf("  %-8s %6lld tensors %12.0f bytes (%s)\n", st_dtype_name((st_dtype)d), (long long)count[d], bytes[d], hb);
    }
    human_bytes(hb, sizeof hb, total);
    printf("weight memory: %.0f bytes (%s), memory-mapped\n", total, hb);
}

/* KV cache of one sequence (spec §15.1). Window rings are a fixed number of rows per layer (and per speculative
 * stage); what grows with the context are the compressed rows: a CSA layer adds one head_dim row and one
 * index_head_dim indexer row per 4 tokens, an HCA layer one head_dim row per 128 tokens. The compressors'
 * rolling states are fixed fp32 rings of per-position projections: the live span (8 positions at ratio 4,
 * 128 at ratio 128) plus the default 16 speculative slots (core/compressor.h). */
static void print_kv(const dsv4_config *c, dsv4_mtp_kind k) {
    const double D = c->head_dim, cI = c->index_head_dim;
    const int stages = spec_stages(c, k);
    double ring_rows = (double)(c->n_layers + stages) * c->window, state_bytes = 0, per_token = 0;
    for (int L = 0; L < c->n_layers; L++) {
        if (c->compress_ratio[L] == 4) {
            per_token += (D + cI) / 4.0;
            state_bytes += 2.0 * (8 + 16) * 2 * D * 4 + 2.0 * (8 + 16) * 2 * cI * 4;
        } else if (c->compress_ratio[L] == 128) {
            per_token += D / 128.0;
            state_bytes += 2.0 * (128 + 16) * D * 4;
        }
    }
    char a[32], b[32], s[32];
    human_bytes(a, sizeof a, ring_rows * D * 4);
    human_bytes(b, sizeof b, ring_rows * D * 2);
    human_bytes(s, sizeof s, state_bytes);
    printf("kv cache per sequence\n");
    printf("  fixed: window rings %d layer(s) x %d rows x %d = f32 %s / bf16 %s (+ speculative slots); "
           "compressor states %s (fp32)\n", c->n_layers + stages, c->window, c->head_dim, a, b, s);
    printf("  per context token: %.4g values = f32 %.4g bytes / bf16 %.4g bytes\n", per_token, per_token * 4,
           per_token * 2);
    const double ctx[2] = {4096, (double)c->max_position};
    for (int i = 0; i < 2; i++) {
        human_bytes(a, sizeof a, ctx[i] * per_token * 4);
        human_bytes(b, sizeof b, ctx[i] * per_token * 2);
        printf("  compressed rows at %.0f tokens: f32 %s / bf16 %s\n", ctx[i], a, b);
    }
    printf("  stored KV per --kv format (dsv4 logits --kv f32|bf16|fp8):\n");
    kv_cost_report(stdout, "    ", -1, c->n_layers, c->compress_ratio, c->head_dim, c->rope_dim, c->index_head_dim,
                   c->window);
}

/* With an index file, every tensor stored in a shard must be listed there (the reader only checks the
 * converse); a checkpoint whose index lost an entry is corrupt even if the tensor is still in its shard. */
static int check_index_covers(const char *dir, const st_archive *a, dsv4_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) != 0) return 0;
    char *text = NULL;
    int rc = dsv4_read_file(path, &text, NULL, err);
    if (rc) return rc;
    json_t *idx = json_loads(text, 0, NULL);
    free(text);
    json_t *wm = json_object_get(idx, "weight_map");
    for (int i = 0; i < a->n_tensors && !rc; i++)
        if (!json_object_get(wm, a->tensors[i].name))
            rc = dsv4_fail(err, DSV4_E_MODEL, "tensor %s is stored in %s but missing from %s", a->tensors[i].name,
                           a->shards[a->tensors[i].shard].path, path);
    json_decref(idx);
    return rc;
}

/* Values a loader would trip over later: NaN scale bytes, hash-routing rows out of range or repeating. */
static int check_values(const dsv4_config *c, const st_archive *a, dsv4_error *err) {
    for (int i = 0; i < a->n_tensors; i++) {
        const st_tensor *t = &a->tensors[i];
        if (t->dtype == ST_F8_E8M0) {
            const uint8_t *b = t->data;
            for (size_t j = 0; j < t->nbytes; j++)
                if (b[j] == 255) return dsv4_fail(err, DSV4_E_MODEL, "tensor %s: scale byte %zu is NaN (0xff)", t->name, j);
        }
        size_t nl = strlen(t->name);
        if (nl < 7 || strcmp(t->name + nl - 7, "tid2eid") || t->ndim != 2) continue;
        const int64_t rows = t->shape[0], k = t->shape[1];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < k; j++) {
                int64_t e, f;
                if (t->dtype == ST_I64) { memcpy(&e, (const char *)t->data + 8 * (r * k + j), 8); }
                else { int32_t v; memcpy(&v, (const char *)t->data + 4 * (r * k + j), 4); e = v; }
                if (e < 0 || e >= c->n_routed)
                    return dsv4_fail(err, DSV4_E_MODEL, "tensor %s: token %lld routes to expert %lld, outside 0..%d",
                                     t->name, (long long)r, (long long)e, c->n_routed - 1);
                for (int64_t jj = 0; jj < j; jj++) {
                    if (t->dtype == ST_I64) memcpy(&f, (const char *)t->data + 8 * (r * k + jj), 8);
                    else { int32_t v; memcpy(&v, (const char *)t->data + 4 * (r * k + jj), 4); f = v; }
                    if (f == e)
                        return dsv4_fail(err, DSV4_E_MODEL, "tensor %s: token %lld lists expert %lld twice", t->name,
                                         (long long)r, (long long)e);
                }
            }
    }
    return 0;
}

/* Tensors the config does not use are not an error (the official converter drops some), but worth a note. */
static void note_unused(const dsv4_inventory *inv, const st_archive *a) {
    int unused = 0;
    const char *example = NULL;
    for (int i = 0; i < a->n_tensors; i++) {
        int found = 0;
        for (int j = 0; j < inv->n && !found; j++) found = !strcmp(inv->v[j].name, a->tensors[i].name);
        if (!found) { unused++; if (!example) example = a->tensors[i].name; }
    }
    if (unused) printf("note: %d stored tensor(s) not used by this config (e.g. %s)\n", unused, example);
}

static int inspect(const char *dir) {
    dsv4_error err = {0};
    dsv4_config cfg;
    if (dsv4_config_load(dir, &cfg, &err)) return cli_fail("inspect", &err);
    printf("checkpoint %s\n", dir);
    print_config(&cfg);

    st_archive a;
    if (st_open_dir(dir, &a, &err)) {
        printf("problem: %s\n", err.msg);
        return cli_fail("inspect", &err);
    }
    dsv4_mtp_kind kind = detect_spec_heads(&a);
    printf("speculative heads: %s\n", kind == MTP_V4 ? "v4 mtp (mtp.0)" : kind == MTP_DSPARK ? "dspark" : "none");
    print_tensors(&a);
    print_kv(&cfg, kind);

    dsv4_inventory inv;
    int rc = dsv4_inventory_build(&cfg, kind, &inv, &err);
    if (rc && kind != MTP_NONE)
        dsv4_wrap(&err, "the shards hold %s tensors (%s) but the config does not describe them",
                  kind == MTP_V4 ? "V4 MTP" : "DSpark", kind == MTP_V4 ? "mtp.0.e_proj.weight" : "mtp.0.main_proj.weight");
    if (!rc) {
        printf("inventory: %d tensors expected for this config\n", inv.n);
        rc = dsv4_inventory_check(&inv, &a, &err);
        if (!rc) rc = check_index_covers(dir, &a, &err);
        if (!rc) rc = check_values(&cfg, &a, &err);
        if (!rc) note_unused(&inv, &a);
        dsv4_inventory_free(&inv);
    }
    st_close(&a);
    if (rc) {
        printf("problem: %s\n", err.msg);
        return cli_fail("inspect", &err);
    }
    printf("problems: none\n");
    return 0;
}

/* Where a GPU load with this budget would put the routed experts (model/expert_place.h): the same function the
 * CUDA loader calls, on the CPU, so it needs no GPU. */
static int print_placement(const char *dir, const cli_placement *pl) {
    dsv4_error err;
    dsv4_model *m;
    const dsv4_load_opts lo = { .quiet = 1, .n_threads = 1 };
    if (dsv4_model_load(dir, &lo, &m, &err)) return cli_fail("inspect", &err);
    expert_profile prof;
    expert_map map;
    uint64_t fixed = 0, one = 0;
    int rc = expert_profile_find(dir, pl->expert_profile, m->cfg.n_layers, m->cfg.n_routed, m->cfg.n_act, &prof, &err);
    if (!rc) rc = expert_map_for_budget(m, (uint64_t)(pl->gpu_mem_gb * 1073741824.0), prof.counts, &map, &fixed, &one, &err);
    if (rc) {
        expert_profile_free(&prof);
        dsv4_model_free(m);
        return cli_fail("inspect", &err);
    }
    const int L = m->cfg.n_layers, E = m->cfg.n_routed;
    const int64_t total = (int64_t)L * E, on_gpu = total - map.n_host;
    char fb[32], gb[32], hb[32];
    human_bytes(fb, sizeof fb, (double)fixed);
    human_bytes(gb, sizeof gb, on_gpu * (double)one);
    human_bytes(hb, sizeof hb, map.n_host * (double)one);
    printf("placement for --gpu-mem %g GiB: %s of other weights and %lld of %lld routed experts (%s) on the GPU, %lld "
           "experts (%s) in host memory; %s\n", pl->gpu_mem_gb, fb, (long long)on_gpu, (long long)total, gb,
           (long long)map.n_host, hb,
           !map.n_host ? "everything fits" : prof.counts ? "the most used by the routing profile stay on the GPU" : "spread evenly");
    printf("  routed experts on the GPU per layer:");
    for (int l = 0; l < L; l++) printf(" %d:%d", l, expert_map_gpu_count(&map, l));
    printf("\n");
    if (map.n_host && pl->bus_by_token) {
        const int pct = expert_split_pct(pl->bus_share);   /* >= 0: main() refused a negative share */
        const int fits = !expert_map_split_tokens(&map, pct, expert_bus_room(one));
        printf("  of each token's routes to experts in host memory: %d %% over the bus to the GPU, the rest to the CPU "
               "(--bus-by-token); every host expert page-locked (%s): %s\n", pct, hb,
               fits ? "fits" : "MORE than 60 % of this machine's memory, a load fails");
    } else if (map.n_host) {
        const int pct = expert_map_split_bus(&map, expert_bus_pct(pl->bus_share), m->cfg.n_act, prof.counts, expert_bus_room(one));
        human_bytes(hb, sizeof hb, (map.n_host - map.n_bus) * (double)one);
        human_bytes(gb, sizeof gb, map.n_bus * (double)one);
        printf("  of the experts in host memory: %lld (%s) computed by the CPU, %lld (%s, page-locked) by the GPU over the bus "
               "(--bus-share %.2f)\n", (long long)(map.n_host - map.n_bus), hb, (long long)map.n_bus, gb, pct / 100.0);
        if (prof.counts) {   /* what the placement means for the profiled prompts' routes */
            double share[EXPERT_OWNERS], uniform[EXPERT_OWNERS];
            expert_map_route_shares(&map, prof.counts, share, uniform);
            printf("  of the profile's routes: %.1f %% to experts on the GPU, %.1f %% to the host's cores, %.1f %% over the bus "
                   "(uniform routing: %.1f / %.1f / %.1f %%)\n", 100 * share[0], 100 * share[1], 100 * share[2],
                   100 * uniform[0], 100 * uniform[1], 100 * uniform[2]);
        }
    }
    expert_map_free(&map);
    expert_profile_free(&prof);
    dsv4_model_free(m);
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    const char *dir = NULL;
    cli_placement pl = { 0 };
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dsv4 inspect -m DIR [--gpu-mem GB [--expert-profile FILE] [--bus-share F] [--bus-by-token]]\n");
            return 0;
        }
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(dir = cli_value("inspect", argc, argv, &i))) return 1;
        } else if ((r = cli_placement_option("inspect", argc, argv, &i, &pl)) != 0) {
            if (r < 0) return 1;
        } else {
            return cli_error("inspect", "unknown option '%s' (usage: dsv4 inspect -m DIR [--gpu-mem GB [--expert-profile FILE] "
                             "[--bus-share F] [--bus-by-token]])", argv[i]);
        }
    }
    if (!dir) return cli_error("inspect", "missing -m DIR");
    if (pl.expert_profile && !pl.gpu_mem_gb) return cli_error("inspect", "--expert-profile needs --gpu-mem GB (the placement it chooses)");
    if (pl.bus_share && !pl.gpu_mem_gb) return cli_error("inspect", "--bus-share needs --gpu-mem GB (the placement it splits)");
    if (pl.bus_by_token && !pl.gpu_mem_gb) return cli_error("inspect", "--bus-by-token needs --gpu-mem GB (the placement it splits)");
    if (pl.bus_by_token && pl.bus_share < 0) return cli_error("inspect", "--bus-by-token needs a --bus-share above 0");
    const int rc = inspect(dir);
    return rc || !pl.gpu_mem_gb ? rc : print_placement(dir, &pl);
}
