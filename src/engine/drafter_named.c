/* Drafters by name: see drafter_named.h. */
#include "engine/drafter_named.h"
#include "engine/drafter_dspark.h"
#include "engine/drafter_mtp.h"
#include "model/model.h" /* dspark_block_size */
#include "util/error.h"
#include <string.h>

int dsv4_drafter_name_known(const char *name) {
    return name && (!strcmp(name, "ngram") || !strcmp(name, "self") || !strcmp(name, "mtp") || !strcmp(name, "dspark"));
}

int dsv4_drafter_named(const char *name, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err) {
    if (!name) return dsv4_fail(err, DSV4_E_ARG, "no drafter name");
    if (!strcmp(name, "ngram")) return dsv4_drafter_ngram(1, 4, out, err);
    if (!strcmp(name, "self")) return dsv4_drafter_self(m, sp, out, err);
    if (!strcmp(name, "mtp")) return dsv4_drafter_mtp(m, sp, out, err);
    if (!strcmp(name, "dspark")) return dsv4_drafter_dspark(m, sp, out, err);
    return dsv4_fail(err, DSV4_E_ARG, "unknown drafter '%s' (ngram, self, mtp, dspark)", name);
}

int dsv4_drafter_named_make(void *ctx, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err) {
    return dsv4_drafter_named(ctx, m, sp, out, err);
}

int dsv4_drafter_default_draft(const char *name, const dsv4_model *m) {
    if (name && !strcmp(name, "mtp")) return 1;
    int d = 4;
    if (name && !strcmp(name, "dspark") && m->cfg.dspark_block_size > 0) d = m->cfg.dspark_block_size;
    return d < m->max_spec - 1 ? d : m->max_spec - 1; /* a rollback undoes at most max_spec - 1 drafts */
}
