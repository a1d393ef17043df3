#include "model/route_count.h"
#include "backend/cuda/cuda_backend.h"
#include "model/model.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

int model_count_routes(struct dsv4_model *m, int on, dsv4_error *err) {
    const int L = m->cfg.n_layers, E = m->cfg.n_routed;
    for (int l = 0; l < L; l++) m->layers[l].route_counts = NULL;
    free(m->route_counts);
    m->route_counts = NULL;
    m->counted_tokens = 0;
    if (m->device == DSV4_DEVICE_CUDA) return cuda_count_routes(m, on, err);
    if (!on) return DSV4_OK;
    if (!(m->route_counts = calloc((size_t)L * (size_t)E, sizeof *m->route_counts)))
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    for (int l = 0; l < L; l++) m->layers[l].route_counts = m->route_counts + (size_t)l * E;
    return DSV4_OK;
}

int model_route_profile(struct dsv4_model *m, expert_profile *out, dsv4_error *err) {
    const int L = m->cfg.n_layers, E = m->cfg.n_routed;
    int rc = expert_profile_init(out, L, E, err);
    if (rc) return rc;
    if (m->device == DSV4_DEVICE_CUDA) rc = cuda_route_counts(m, out->counts, err);
    else if (!m->route_counts) rc = dsv4_fail(err, DSV4_E_ARG, "routes are not being counted");
    else memcpy(out->counts, m->route_counts, sizeof *out->counts * (size_t)L * E);
    out->tokens = m->counted_tokens;
    if (rc) expert_profile_free(out);
    return rc;
}
