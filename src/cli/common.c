#include "cli/cli.h"
#include "engine/sampler.h"
#include "util/fileio.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dsv4 %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int cli_fail(const char *cmd, const dsv4_error *err) { return cli_error(cmd, "%s", err->msg); }

int cli_parse_int(const char *cmd, const char *opt, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return cli_error(cmd, "%s expects an integer in [%lld, %lld], got '%s'", opt, lo, hi, s);
    *out = v;
    return 0;
}

int cli_parse_float(const char *cmd, const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return cli_error(cmd, "%s expects a number, got '%s'", opt, s);
    *out = v;
    return 0;
}

int cli_parse_tokens(const char *cmd, const char *s, int32_t **out, int *n) {
    char *text = NULL;
    if (s[0] == '@') {
        dsv4_error err;
        if (dsv4_read_file(s + 1, &text, NULL, &err)) return cli_fail(cmd, &err);
        s = text;
    }
    int cap = 64, cnt = 0;
    int32_t *v = malloc(sizeof *v * (size_t)cap);
    const char *p = s;
    int rc = 0;
    while (v) {
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > 2147483647LL) {
            rc = cli_error(cmd, "bad token list near '%.20s' (expected comma-separated non-negative integers)", p);
            break;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, sizeof *v * (size_t)(cap *= 2));
            if (!nv) { free(v); v = NULL; break; }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
        if (*p == ',') p++;
        else if (*p) { rc = cli_error(cmd, "bad token list near '%.20s'", p); break; }
    }
    free(text);
    if (!v) return cli_error(cmd, "out of memory");
    if (rc) { free(v); return rc; }
    if (cnt == 0) { free(v); return cli_error(cmd, "empty token list"); }
    *out = v;
    *n = cnt;
    return 0;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_error(cmd, "option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_parse_mode(const char *cmd, const char *s, dsv4_mode *mode) {
    if (!strcmp(s, "exact")) *mode = DSV4_MODE_EXACT;
    else if (!strcmp(s, "official")) *mode = DSV4_MODE_OFFICIAL;
    else return cli_error(cmd, "--mode must be exact or official, got '%s'", s);
    return 0;
}

int cli_parse_device(const char *cmd, const char *s, int *device) {
    const int d = dsv4_device_parse(s);
    if (d < 0) return cli_error(cmd, "--device must be cpu or cuda, got '%s'", s);
    *device = d;
    return 0;
}

int cli_parse_gpus(const char *cmd, const char *s, int *gpus) {
    char *end = NULL;
    const long n = strtol(s, &end, 10);
    if (!*s || *end || n < 1 || n > 16) return cli_error(cmd, "--gpus must be a number of GPUs from 1 to 16, got '%s'", s);
    *gpus = (int)n;
    return 0;
}

int cli_placement_option(const char *cmd, int argc, char **argv, int *i, cli_placement *pl) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--bus-by-token")) {
        pl->bus_by_token = 1;
        return 1;
    }
    if (strcmp(a, "--gpu-mem") && strcmp(a, "--expert-profile") && strcmp(a, "--bus-share")) return 0;
    if (!(v = cli_value(cmd, argc, argv, i))) return -1;
    if (!strcmp(a, "--expert-profile")) {
        pl->expert_profile = v;
        return 1;
    }
    char *end = NULL;
    if (!strcmp(a, "--bus-share")) {
        const double f = strtod(v, &end);
        if (end == v || *end || !(f >= 0 && f <= 1))
            return cli_error(cmd, "--bus-share must be a share from 0 to 1 (for example 0.5), got '%s'", v), -1;
        pl->bus_share = f > 0 ? f : -1;   /* the API's 0 is "the default" */
        return 1;
    }
    const double gb = strtod(v, &end);
    if (end == v || *end || !(gb > 0) || gb > 1e6)
        return cli_error(cmd, "--gpu-mem must be a positive number of GiB (for example 80 or 0.5), got '%s'", v), -1;
    pl->gpu_mem_gb = gb;
    return 1;
}

int cli_amx_option(const char *arg, cli_placement *pl) {
    if (strcmp(arg, "--amx")) return 0;
    pl->cpu_amx = 1;
    return 1;
}

void cli_placement_apply(const cli_placement *pl, dsv4_load_opts *lo) {
    lo->gpu_mem_gb = pl->gpu_mem_gb;
    lo->expert_profile = pl->expert_profile;
    lo->bus_share = pl->bus_share;
    lo->bus_by_token = pl->bus_by_token;
    lo->cpu_amx = pl->cpu_amx;
}

int cli_sampling_option(const char *cmd, int argc, char **argv, int *i, void *sampling) {
    dsv4_sampling *sp = sampling;
    const char *a = argv[*i], *v;
    double x = 0;
    long long k = 0;
    const int is_float = !strcmp(a, "--temp") || !strcmp(a, "--top-p") || !strcmp(a, "--min-p");
    const int is_int = !strcmp(a, "--top-k") || !strcmp(a, "--seed");
    if (!is_float && !is_int) return 0;
    if (!(v = cli_value(cmd, argc, argv, i))) return -1;
    if (is_float && cli_parse_float(cmd, a, v, &x)) return -1;
    if (!strcmp(a, "--temp")) sp->temperature = (float)x;
    else if (!strcmp(a, "--top-p")) sp->top_p = (float)x;
    else if (!strcmp(a, "--min-p")) sp->min_p = (float)x;
    else if (!strcmp(a, "--top-k")) {
        if (cli_parse_int(cmd, a, v, 0, 1 << 30, &k)) return -1;
        sp->top_k = (int)k;
    } else {
        if (cli_parse_int(cmd, a, v, 0, (long long)(~0ULL >> 1), &k)) return -1;
        sp->seed = (uint64_t)k;
    }
    return 1;
}
