/* The V4 MTP drafter (spec §13): one draft per step from the checkpoint's MTP head. */
#ifndef DSV4_ENGINE_DRAFTER_MTP_H
#define DSV4_ENGINE_DRAFTER_MTP_H
#include "engine/speculative.h"

/* A drafter for one stream of model m (which must carry a V4 MTP head) with that stream's sampling
 * parameters. It needs the verification step's hidden states (dsv4_spec_verify_info.hidden). */
int dsv4_drafter_mtp(dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err);
#endif
