#include "text/hashmap.h"
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static size_t table_size(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 1) cap *= 2;   /* load factor <= 0.5 keeps probe chains short */
    return cap;
}

int dsv4_strmap_init(dsv4_strmap *m, size_t expected) {
    size_t cap = table_size(expected);
    m->slots = calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    m->count = 0;
    return m->slots ? 0 : -1;
}

void dsv4_strmap_free(dsv4_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

int dsv4_strmap_put(dsv4_strmap *m, const char *key, size_t len, int32_t value) {
    if ((m->count + 1) * 2 > m->mask + 1) return -1;
    size_t i = (size_t)XXH3_64bits(key, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        dsv4_strmap_slot *s = &m->slots[i];
        if (!s->key) {
            s->key = key;
            s->len = (uint32_t)len;
            s->value = value;
            m->count++;
            return 0;
        }
        if (s->len == len && memcmp(s->key, key, len) == 0) { s->value = value; return 0; }
    }
}

int32_t dsv4_strmap_get(const dsv4_strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    size_t i = (size_t)XXH3_64bits(key, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        const dsv4_strmap_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->len == len && memcmp(s->key, key, len) == 0) return s->value;
    }
}

static inline size_t pair_hash(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL; k ^= k >> 33;
    return (size_t)k;
}

int dsv4_pairmap_init(dsv4_pairmap *m, size_t expected) {
    size_t cap = table_size(expected);
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

void dsv4_pairmap_free(dsv4_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

int dsv4_pairmap_put(dsv4_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    if ((m->count + 1) * 2 > m->mask + 1) return -1;
    uint64_t k = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (size_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        dsv4_pairmap_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX) {
            s->key = k; s->rank = rank; s->merged = merged;
            m->count++;
            return 0;
        }
        if (s->key == k) return 0;
    }
}

const dsv4_pairmap_slot *dsv4_pairmap_get(const dsv4_pairmap *m, int32_t left, int32_t right) {
    uint64_t k = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (size_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        const dsv4_pairmap_slot *s = &m->slots[i];
        if (s->key == k) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}
