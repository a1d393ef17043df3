/* Companion files of the prefix cache's disk tier (format in prefix_companion.h). The container only pairs a
 * drafter's payload with one stored state and catches damage; what the payload means is the codec's. */
#include "state/prefix_companion.h"
#include "model/model.h"
#include "state/persist.h"
#include "util/error.h"
#include "util/fileio.h"
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the companion format is little-endian; this build writes host order"
#endif

static uint64_t tokens_hash(const int32_t *t, int64_t n) {
    return n > 0 ? XXH64(t, sizeof(int32_t) * (size_t)n, 0) : 0;
}

static int kind_ok(const char *kind) {
    const size_t n = kind ? strlen(kind) : 0;
    if (n == 0 || n >= PREFIX_COMPANION_KIND) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((kind[i] >= 'a' && kind[i] <= 'z') || (kind[i] >= '0' && kind[i] <= '9') || kind[i] == '_')) return 0;
    return 1;
}

static uint32_t model_kv_word(const dsv4_model *m) { return persist_kv_pack(m->kv_format, m->cfg.rope_dim); }

int prefix_companion_file_build(const char *kind, const dsv4_model *m, const int32_t *tokens, int64_t pos,
                                const void *payload, size_t payload_len, void **buf, size_t *len, dsv4_error *err) {
    if (!kind_ok(kind)) return dsv4_fail(err, DSV4_E_ARG, "prefix cache: companion kind \"%s\" is not [a-z0-9_]{1,15}", kind ? kind : "");
    if (payload_len > SIZE_MAX - PREFIX_COMPANION_HEADER - 8) return dsv4_fail(err, DSV4_E_NOMEM, "prefix cache: companion too large");
    const size_t total = PREFIX_COMPANION_HEADER + payload_len + 8;
    uint8_t *p = malloc(total);
    if (!p) return dsv4_fail(err, DSV4_E_NOMEM, "prefix cache: out of memory for a companion of %zu bytes", payload_len);
    const uint32_t version = PREFIX_COMPANION_VERSION, mode = (uint32_t)m->mode, kv = model_kv_word(m);
    const uint64_t fp = m->fingerprint, th = tokens_hash(tokens, pos), plen = payload_len;
    char k[PREFIX_COMPANION_KIND] = {0};
    memcpy(k, kind, strlen(kind));
    size_t o = 0;
    memcpy(p + o, PREFIX_COMPANION_MAGIC, 8); o += 8;
    memcpy(p + o, &version, 4); o += 4;
    memcpy(p + o, k, sizeof k); o += sizeof k;
    memcpy(p + o, &fp, 8); o += 8;
    memcpy(p + o, &mode, 4); o += 4;
    memcpy(p + o, &kv, 4); o += 4;
    memcpy(p + o, &pos, 8); o += 8;
    memcpy(p + o, &th, 8); o += 8;
    memcpy(p + o, &plen, 8); o += 8;
    if (payload_len) memcpy(p + o, payload, payload_len);
    o += payload_len;
    const uint64_t sum = XXH64(p, o, 0);
    memcpy(p + o, &sum, 8);
    *buf = p;
    *len = total;
    return 0;
}

int prefix_companion_file_check(const void *buf, size_t len, const char *kind, const dsv4_model *m,
                                const int32_t *tokens, int64_t pos, size_t *off, size_t *plen, dsv4_error *err) {
    const uint8_t *p = buf;
    if (!p || len < 12) return dsv4_fail(err, DSV4_E_FORMAT, "companion is truncated: %zu bytes, not even a header", len);
    if (memcmp(p, PREFIX_COMPANION_MAGIC, 8)) return dsv4_fail(err, DSV4_E_FORMAT, "not a dsv4 companion file (bad magic)");
    uint32_t version, mode, kv;
    uint64_t fp, th, n;
    int64_t at;
    char k[PREFIX_COMPANION_KIND + 1] = {0};
    memcpy(&version, p + 8, 4);
    if (version != PREFIX_COMPANION_VERSION)
        return dsv4_fail(err, DSV4_E_FORMAT, "companion format version %u is not supported (this build reads version %u)",
                         version, PREFIX_COMPANION_VERSION);
    if (len < PREFIX_COMPANION_HEADER + 8)
        return dsv4_fail(err, DSV4_E_FORMAT, "companion is truncated: %zu bytes, the header alone needs %d", len,
                         PREFIX_COMPANION_HEADER + 8);
    memcpy(k, p + 12, PREFIX_COMPANION_KIND);
    memcpy(&fp, p + 28, 8);
    memcpy(&mode, p + 36, 4);
    memcpy(&kv, p + 40, 4);
    memcpy(&at, p + 44, 8);
    memcpy(&th, p + 52, 8);
    memcpy(&n, p + 60, 8);
    if (n != len - PREFIX_COMPANION_HEADER - 8)
        return dsv4_fail(err, DSV4_E_FORMAT, "companion is %zu bytes, its header implies %llu (truncated or trailing garbage)",
                         len, (n > UINT64_MAX - PREFIX_COMPANION_HEADER - 8) ? 0ULL : (unsigned long long)(n + PREFIX_COMPANION_HEADER + 8));
    uint64_t stored;
    memcpy(&stored, p + len - 8, 8);
    if (XXH64(p, len - 8, 0) != stored) return dsv4_fail(err, DSV4_E_FORMAT, "companion checksum mismatch: the data is corrupted");
    /* intact; now whether it is this entry's */
    if (strcmp(k, kind))
        return dsv4_fail(err, DSV4_E_STATE, "companion holds a \"%.16s\" drafter state, \"%s\" was asked for", k, kind);
    if (fp != m->fingerprint || mode != (uint32_t)m->mode || kv != model_kv_word(m))
        return dsv4_fail(err, DSV4_E_STATE, "companion belongs to another model (fingerprint %016llx, this model %016llx) "
                         "or another numeric mode or KV format", (unsigned long long)fp, (unsigned long long)m->fingerprint);
    if (at != pos || th != tokens_hash(tokens, pos))
        return dsv4_fail(err, DSV4_E_STATE, "companion belongs to another prefix (position %lld, the state's %lld)",
                         (long long)at, (long long)pos);
    *off = PREFIX_COMPANION_HEADER;
    *plen = (size_t)n;
    return 0;
}

int prefix_companion_file_load(const char *path, const prefix_codec *codec, dsv4_model *m, const int32_t *tokens,
                               int64_t pos, prefix_companion **out, dsv4_error *err) {
    char *buf;
    size_t len, off = 0, plen = 0;
    int rc = dsv4_read_file(path, &buf, &len, err);
    if (rc) return rc;
    rc = prefix_companion_file_check(buf, len, codec->kind, m, tokens, pos, &off, &plen, err);
    if (!rc) rc = codec->decode(m, tokens, pos, buf + off, plen, out, err);
    free(buf);
    if (rc) dsv4_wrap(err, "%s", path);
    return rc;
}

int prefix_companion_file_save(const char *path, const prefix_companion *comp, const dsv4_model *m,
                               const int32_t *tokens, int64_t pos, dsv4_error *err) {
    if (!comp->codec || !comp->codec->encode) return dsv4_fail(err, DSV4_E_ARG, "prefix cache: companion without a codec");
    void *payload, *file;
    size_t plen, len;
    int rc = comp->codec->encode(comp, &payload, &plen, err);
    if (rc) return rc;
    rc = prefix_companion_file_build(comp->codec->kind, m, tokens, pos, payload, plen, &file, &len, err);
    free(payload);
    if (rc) return rc;
    rc = dsv4_write_file_atomic(path, file, len, err);
    free(file);
    return rc;
}
