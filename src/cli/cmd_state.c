/* dsv4 state inspect FILE: print a saved sequence state's header, per-layer sizes and bytes per context
 * token. Needs no model: the header alone determines every size, and the checksum is verified. */
#include "cli/cli.h"
#include "state/kvrows.h"
#include "state/persist.h"
#include "util/error.h"
#include "util/fileio.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *CMD = "state";

static const char *layer_kind(int ratio) { return ratio == 4 ? "CSA" : ratio == 128 ? "HCA" : "SWA"; }

static void print_state(const char *path, const persist_header *h, const persist_sizes *sz) {
    printf("file: %s\n", path);
    printf("format: dsv4 sequence state v%u, checksum ok (xxh64)\n", h->version);
    printf("written by: %s\n", h->writer[0] ? h->writer : "unknown (format v1 does not record it)");
    printf("model fingerprint: %016llx\n", (unsigned long long)h->fingerprint);
    printf("numeric mode: %s\n", h->mode == DSV4_MODE_EXACT ? "exact" : h->mode == DSV4_MODE_OFFICIAL ? "official" : "unknown");
    int kv_fmt, kv_rope;
    printf("kv storage: %s\n", persist_kv_unpack(h->kv_format, &kv_fmt, &kv_rope) ? "unknown" : kv_format_name(kv_fmt));
    printf("position: %lld tokens\n", (long long)h->pos);
    printf("shapes: %u layers, head_dim %u, index_head_dim %u, window %u (saved from a ring of %u)\n", h->n_layers,
           h->head_dim, h->index_head_dim, h->window, h->ring_len);
    printf("total: %llu bytes (header %llu, tokens %llu)\n", (unsigned long long)sz->total,
           (unsigned long long)sz->header, (unsigned long long)sz->tokens);
    for (uint32_t L = 0; L < h->n_layers; L++) {
        const int r = h->ratio[L];
        printf("  layer %2u %s", L, layer_kind(r));
        if (r) printf(" m=%-3d compressed rows %lld", r, (long long)(h->pos / r));
        if (r == 4) printf(", indexer rows %lld", (long long)(h->pos / 4));
        printf(": %llu bytes\n", (unsigned long long)sz->layer[L]);
    }
    printf("bytes per context token: %.1f (growth once the window is full; fixed part %llu bytes)\n", sz->per_token,
           (unsigned long long)sz->fixed);
}

static int inspect(const char *path) {
    char *buf;
    size_t len;
    dsv4_error err;
    if (dsv4_read_file(path, &buf, &len, &err)) return cli_fail(CMD, &err);
    persist_header h;
    persist_sizes sz;
    int rc = persist_read_header(buf, len, &h, &err);
    free(buf);
    if (rc) {
        dsv4_wrap(&err, "%s", path);
        return cli_fail(CMD, &err);
    }
    persist_sizes_of(&h, &sz);
    print_state(path, &h, &sz);
    return 0;
}

int cmd_state(int argc, char **argv) {
    if (argc < 2) return cli_error(CMD, "usage: dsv4 state inspect FILE");
    if (!strcmp(argv[1], "inspect")) {
        if (argc != 3) return cli_error(CMD, "usage: dsv4 state inspect FILE");
        return inspect(argv[2]);
    }
    return cli_error(CMD, "unknown subcommand '%s' (known: inspect)", argv[1]);
}
