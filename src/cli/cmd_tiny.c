/* dsv4 tiny -o DIR [--preset flash-tiny|pro-tiny] [--seed N] [--set KEY=VALUE ...] [--mtp none|v4|dspark]
 *           [--shards N]
 * Writes a synthetic checkpoint in the exact official format (DESIGN §7). */
#include "cli/cli.h"
#include "model/tiny.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void) {
    fprintf(stderr,
            "usage: dsv4 tiny -o DIR [--preset flash-tiny|pro-tiny] [--seed N] [--set KEY=VALUE ...]\n"
            "                 [--mtp none|v4|dspark] [--shards N]\n"
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

int cmd_tiny(int argc, char **argv) {
    const char *dir = NULL;
    dsv4_tiny_opts o = {.preset = "flash-tiny", .seed = 0, .mtp = MTP_NONE, .n_shards = 2};
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) return cli_error("tiny", "out of memory");
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i], *v = NULL;
        long long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); free(sets); return 0; }
        if (strcmp(a, "-o") && strcmp(a, "--out") && strcmp(a, "--preset") && strcmp(a, "--seed") &&
            strcmp(a, "--set") && strcmp(a, "--mtp") && strcmp(a, "--shards")) {
            rc = cli_error("tiny", "unknown option '%s' (try dsv4 tiny --help)", a);
            break;
        }
        if (!(v = cli_value("tiny", argc, argv, &i))) { rc = 1; break; }
        if (!strcmp(a, "-o") || !strcmp(a, "--out")) dir = v;
        else if (!strcmp(a, "--preset")) o.preset = v;
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
        if (dsv4_tiny_write(dir, &o, &err)) rc = cli_fail("tiny", &err);
        else fprintf(stderr, "dsv4 tiny: wrote %s (preset %s, seed %llu)\n", dir, o.preset, (unsigned long long)o.seed);
    }
    free(sets);
    return rc;
}
