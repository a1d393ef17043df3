/* The DSpark drafter (spec §14): gamma drafts per step from the V4-Flash-0731 drafting head. */
#ifndef DSV4_ENGINE_DRAFTER_DSPARK_H
#define DSV4_ENGINE_DRAFTER_DSPARK_H
#include "engine/speculative.h"

/* A drafter for one stream of model m (which must carry the DSpark head) with that stream's sampling
 * parameters. It reports per-draft confidences (the stream's conf_threshold applies the survival cut). */
int dsv4_drafter_dspark(dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err);
#endif
