/* A synthetic checkpoint's holes filled in host memory (model/synthetic.h): the values of model/synth_values.h, and
 * the arena a CPU model reads every tensor from. */
#include "model/synthetic.h"
#include "model/synth_values.h"
#include "util/bigmem.h"
#include "util/error.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int synthetic_hole_kind(st_dtype d) {
    return d == ST_F8_E4M3 ? SYNTH_FP8 : d == ST_I8 ? SYNTH_FP4 : d == ST_BF16 ? SYNTH_BF16 : 0;
}

void synth_fill(uint8_t *hole, size_t b0, size_t b1, int kind, uint64_t seed) {
    if (!kind) {
        memset(hole + b0, SYNTH_SCALE_BYTE, b1 - b0);
        return;
    }
    for (size_t w = b0 / 8; w * 8 < b1; w++) {
        uint8_t b[8];
        synth_word(kind, seed, w, b);
        memcpy(hole + w * 8, b, b1 - w * 8 < 8 ? b1 - w * 8 : 8);
    }
}

int synth_host_budget(size_t *bytes, dsv4_error *err) {
    const char *e = getenv("DSV4_SYNTHETIC_HOST_GB");
    if (e) {
        char *end;
        const double gb = strtod(e, &end);
        if (end == e || *end || !(gb > 0 && gb < 1e6))
            return dsv4_fail(err, DSV4_E_ARG, "DSV4_SYNTHETIC_HOST_GB: expected a number of GiB above 0, got '%s'", e);
        *bytes = (size_t)(gb * 1073741824.0);
        return DSV4_OK;
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    *bytes = pages > 0 && page > 0 ? (size_t)((double)pages * (double)page * 0.6) : (size_t)16 << 30;
    return DSV4_OK;
}

/* ---- the arena ---- */

/* Where tensor i's bytes come from: a copy of src, a fill (src NULL), or tensor `share`'s bytes (share >= 0). */
typedef struct {
    const void *src;
    size_t off;
    int64_t share;
} placed;

/* The routed-expert tensors with bytes of their own of one dtype and shape, for the cycle of those sharing them. */
typedef struct {
    const st_tensor *like;
    int64_t *own, n_own, cap, n_shared;
} share_key;

static int is_expert(const st_tensor *t) { return strstr(t->name, ".ffn.experts.") != NULL; }

static int same_kind(const st_tensor *a, const st_tensor *b) {
    return a->dtype == b->dtype && a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof a->shape);
}

static share_key *key_of(share_key **keys, int *n_keys, const st_tensor *t) {
    for (int k = 0; k < *n_keys; k++)
        if (same_kind((*keys)[k].like, t)) return &(*keys)[k];
    share_key *nk = realloc(*keys, sizeof *nk * (size_t)(*n_keys + 1));
    if (!nk) return NULL;
    *keys = nk;
    nk[*n_keys] = (share_key){ .like = t };
    return &nk[(*n_keys)++];
}

static int key_add(share_key *k, int64_t i) {
    if (k->n_own == k->cap) {
        const int64_t nc = k->cap ? 2 * k->cap : 64;
        int64_t *no = realloc(k->own, sizeof *no * (size_t)nc);
        if (!no) return -1;
        k->own = no, k->cap = nc;
    }
    k->own[k->n_own++] = i;
    return 0;
}

/* The fill, by threads taking slices of at most 64 MiB (one thread cannot fill or copy gigabytes at memory speed). */
typedef struct {
    const st_archive *a;
    const placed *pl;
    uint8_t *base;
    _Atomic int64_t next;    /* the next slice: (tensor, piece) flattened below */
    const int64_t *first;    /* first[i] = tensor i's first slice number; first[n_tensors] = the count */
} fill_job;

enum { SLICE = 64 << 20 };

static void *fill_worker(void *arg) {
    fill_job *j = arg;
    const int n = j->a->n_tensors;
    for (;;) {
        const int64_t s = atomic_fetch_add(&j->next, 1);
        if (s >= j->first[n]) return NULL;
        int lo = 0, hi = n - 1;   /* the tensor whose slices hold s: the last i with first[i] <= s */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (j->first[mid] <= s) lo = mid;
            else hi = mid - 1;
        }
        const st_tensor *t = &j->a->tensors[lo];
        const placed *p = &j->pl[lo];
        const size_t b0 = (size_t)(s - j->first[lo]) * SLICE, b1 = b0 + SLICE < t->nbytes ? b0 + SLICE : t->nbytes;
        if (p->src) memcpy(j->base + p->off + b0, (const uint8_t *)p->src + b0, b1 - b0);
        else synth_fill(j->base + p->off, b0, b1, synthetic_hole_kind(t->dtype), 0x5eed0000ULL + (uint64_t)lo);
    }
}

static void fill_arena(const st_archive *a, const placed *pl, const int64_t *first, uint8_t *base, int threads) {
    fill_job j = { .a = a, .pl = pl, .base = base, .first = first };
    atomic_init(&j.next, 0);
    enum { MAX_THREADS = 256 };
    if (threads <= 0) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus > 0 ? (int)cpus : 1;
    }
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (int i = 1; i < threads && i < first[a->n_tensors]; i++)   /* the caller is one of the fillers */
        if (!pthread_create(&tid[started], NULL, fill_worker, &j)) started++;
    fill_worker(&j);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
}

int synth_host_build(st_archive *a, size_t budget, int threads, synth_host *h, dsv4_error *err) {
    memset(h, 0, sizeof *h);
    const int n = a->n_tensors;
    placed *pl = calloc((size_t)n + 1, sizeof *pl);
    int64_t *first = calloc((size_t)n + 1, sizeof *first);
    share_key *keys = NULL;
    int n_keys = 0, rc = DSV4_OK;
    if (!pl || !first) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    size_t bytes = 0;
    /* everything but the routed experts' holes: bytes of its own, whatever the budget */
    for (int i = 0; !rc && i < n; i++) {
        const st_tensor *t = &a->tensors[i];
        pl[i].share = -1;
        if (is_expert(t) && synthetic_hole_tensor(t->dtype, t->nbytes)) continue;
        pl[i].src = synthetic_hole_tensor(t->dtype, t->nbytes) ? NULL : t->data;
        pl[i].off = bytes;
        bytes += (t->nbytes + 63) / 64 * 64;
    }
    if (!rc && bytes > budget)
        rc = dsv4_fail(err, DSV4_E_NOMEM, "this synthetic checkpoint's tensors other than the routed experts take %.2f GiB, more "
                       "than the %.2f GiB its weights may take in host memory (60 %% of the machine's, or DSV4_SYNTHETIC_HOST_GB)",
                       bytes / 1073741824.0, budget / 1073741824.0);
    /* the routed experts' holes: their own while the budget lasts, then a share of those of their kind */
    for (int i = 0; !rc && i < n; i++) {
        const st_tensor *t = &a->tensors[i];
        if (!is_expert(t) || !synthetic_hole_tensor(t->dtype, t->nbytes)) continue;
        h->expert_tensors++;
        share_key *k = key_of(&keys, &n_keys, t);
        if (!k) { rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); break; }
        const size_t need = (t->nbytes + 63) / 64 * 64;
        if (k->n_own && bytes + need > budget) {
            pl[i].share = k->own[k->n_shared++ % k->n_own];
            continue;
        }
        if (key_add(k, i)) { rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); break; }
        pl[i].off = bytes;
        bytes += need;
        h->expert_own++;
    }
    if (!rc && bytes && !(h->base = bigmem_alloc(bytes)))
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of host memory for this synthetic checkpoint's weights (%.2f GiB)", bytes / 1073741824.0);
    if (!rc) {
        h->bytes = bytes;
        for (int i = 0; i < n; i++) {
            const size_t nb = pl[i].share < 0 ? a->tensors[i].nbytes : 0;
            first[i + 1] = first[i] + (int64_t)((nb + SLICE - 1) / SLICE);
        }
        fill_arena(a, pl, first, h->base, threads);
        for (int i = 0; i < n; i++)   /* a share's source has bytes of its own: repointed first or later, the same place */
            a->tensors[i].data = h->base + pl[pl[i].share < 0 ? i : pl[i].share].off;
    }
    for (int k = 0; k < n_keys; k++) free(keys[k].own);
    free(keys);
    free(first);
    free(pl);
    if (rc) synth_host_free(h);
    return rc;
}

void synth_host_free(synth_host *h) {
    bigmem_free(h->base, h->bytes);
    memset(h, 0, sizeof *h);
}
