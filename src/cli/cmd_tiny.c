/* dsv4 tiny -o DIR [--preset flash-tiny|pro-tiny] [--seed N] [--set KEY=VALUE ...] [--mtp none|v4|dspark]
 *           [--shards N] [--tokenizer DIR_OR_FILE]
 * Writes a synthetic checkpoint in the exact official format (DESIGN §7). --tokenizer ships a tokenizer with it
 * (tokenizer.json, plus tokenizer_config.json when it sits next to it), as real checkpoints do. */
#include "cli/cli.h"
#include "model/tiny.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/fileio.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(void) {
    fprintf(stderr,
            "usage: dsv4 tiny -o DIR [--preset flash-tiny|pro-tiny] [--seed N] [--set KEY=VALUE ...]\n"
            "                 [--mtp none|v4|dspark] [--shards N] [--tokenizer DIR_OR_FILE]\n"
            "  KEY is a config.json field (Hugging Face names; dotted for nested: rope_scaling.factor),\n"
            "  VALUE is JSON: --set compress_ratios=[0,4,128] --set sliding_window=8\n");
}

static int parse_mtp(const char *s, dsv4_mtp_kind *out) {
    if (!strcmp(s, "none")) *out = MTP_NONE;
    else if (!strcmp(s, "v4")) *out = MTP_V4;
    else if (!strcmp(s, "dspark")) *out = MTP_DSPARK;
    else return cli_error("tiny", "--mtp expects none, v4 or dspark, got '%s'", s);
    return 0;
}

/* Where tokenizer.json and tokenizer_config.json are for --tokenizer: a folder holding them, or the json file
 * itself (its config is then looked for in the same folder). Paths are written into json/cfg (PATH_MAX-ish). */
static void tokenizer_paths(const char *src, char *json, char *cfg, size_t cap) {
    struct stat st;
    if (stat(src, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(json, cap, "%s/tokenizer.json", src);
        snprintf(cfg, cap, "%s/tokenizer_config.json", src);
        return;
    }
    snprintf(json, cap, "%s", src);
    const char *slash = strrchr(src, '/');
    if (slash) snprintf(cfg, cap, "%.*s/tokenizer_config.json", (int)(slash - src), src);
    else snprintf(cfg, cap, "tokenizer_config.json");
}

static int copy_file(const char *from, const char *to, dsv4_error *err) {
    char *data = NULL;
    size_t len = 0;
    if (dsv4_read_file(from, &data, &len, err)) return err->code;
    int rc = dsv4_write_file_atomic(to, data, len, err);
    free(data);
    return rc;
}

/* Check the tokenizer against the model before anything is written: every id it can produce must be a row of
 * the embedding (vocab_size >= the tokenizer's highest id + 1), or generation could emit ids it cannot decode
 * and the tokenizer could encode ids the model cannot embed. */
static int check_tokenizer(const dsv4_tiny_opts *o, const char *json, const char *cfg_path, dsv4_error *err) {
    char *cfg_text = NULL;
    dsv4_config cfg;
    if (dsv4_tiny_config(o, &cfg_text, &cfg, err)) return err->code;
    free(cfg_text);
    struct stat st;
    dsv4_tokenizer *t = NULL;
    if (dsv4_tokenizer_load(json, stat(cfg_path, &st) == 0 ? cfg_path : NULL, &t, err))
        return dsv4_wrap(err, "--tokenizer");
    int32_t tok_vocab = dsv4_tokenizer_vocab_size(t);
    dsv4_tokenizer_free(t);
    if (tok_vocab > cfg.vocab_size)
        return dsv4_fail(err, DSV4_E_ARG, "--tokenizer %s has %d ids but the model's vocab_size is %d "
                         "(use --set vocab_size=%d or more)", json, tok_vocab, cfg.vocab_size, tok_vocab);
    return 0;
}

static int ship_tokenizer(const char *dir, const char *json, const char *cfg_path, dsv4_error *err) {
    char dst[4096];
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    if (copy_file(json, dst, err)) return err->code;
    struct stat st;
    if (stat(cfg_path, &st) != 0) return 0;   /* the config is optional */
    snprintf(dst, sizeof dst, "%s/tokenizer_config.json", dir);
    return copy_file(cfg_path, dst, err);
}

int cmd_tiny(int argc, char **argv) {
    const char *dir = NULL, *tokenizer = NULL;
    dsv4_tiny_opts o = {.preset = "flash-tiny", .seed = 0, .mtp = MTP_NONE, .n_shards = 2};
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) return cli_error("tiny", "out of memory");
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i], *v = NULL;
        long long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); free(sets); return 0; }
        if (strcmp(a, "-o") && strcmp(a, "--out") && strcmp(a, "--preset") && strcmp(a, "--seed") &&
            strcmp(a, "--set") && strcmp(a, "--mtp") && strcmp(a, "--shards") && strcmp(a, "--tokenizer")) {
            rc = cli_error("tiny", "unknown option '%s' (try dsv4 tiny --help)", a);
            break;
        }
        if (!(v = cli_value("tiny", argc, argv, &i))) { rc = 1; break; }
        if (!strcmp(a, "-o") || !strcmp(a, "--out")) dir = v;
        else if (!strcmp(a, "--preset")) o.preset = v;
        else if (!strcmp(a, "--tokenizer")) tokenizer = v;
        else if (!strcmp(a, "--set")) sets[o.n_sets++] = v;
        else if (!strcmp(a, "--mtp")) rc = parse_mtp(v, &o.mtp);
        else if (!strcmp(a, "--seed")) {
            if (!(rc = cli_parse_int("tiny", "--seed", v, 0, 9223372036854775807LL, &n))) o.seed = (uint64_t)n;
        } else if (!strcmp(a, "--shards")) {
            if (!(rc = cli_parse_int("tiny", "--shards", v, 1, 99999, &n))) o.n_shards = (int)n;
        }
    }
    if (!rc && !dir) rc = cli_error("tiny", "missing -o DIR (try dsv4 tiny --help)");
    if (!rc) {
        o.sets = sets;
        dsv4_error err = {0};
        char tok_json[4096], tok_cfg[4096];
        if (tokenizer) tokenizer_paths(tokenizer, tok_json, tok_cfg, sizeof tok_json);
        if (tokenizer && check_tokenizer(&o, tok_json, tok_cfg, &err)) rc = cli_fail("tiny", &err);
        else if (dsv4_tiny_write(dir, &o, &err)) rc = cli_fail("tiny", &err);
        else if (tokenizer && ship_tokenizer(dir, tok_json, tok_cfg, &err)) rc = cli_fail("tiny", &err);
        else fprintf(stderr, "dsv4 tiny: wrote %s (preset %s, seed %llu)\n", dir, o.preset, (unsigned long long)o.seed);
    }
    free(sets);
    return rc;
}
