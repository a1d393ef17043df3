/* Where each routed expert lives when one model is spread over several GPUs (expert parallelism, DESIGN §8.4).
 *
 * Every main layer cuts its E experts into n_ranks contiguous ranges, the first E % n_ranks ranges one expert
 * longer: rank r owns [expert_first(E, n, r), expert_first(E, n, r + 1)). Contiguous and even in every layer,
 * because each layer's routed work is split the same way: a rank that owned none of a layer's experts would sit
 * idle through that layer. Rank 0 also holds everything that is not a routed expert (attention, router, shared
 * expert, head, the MTP / DSpark blocks with all their experts) and every sequence's state, so the placement
 * never touches state: a state saved on n GPUs restores on one and the other way round.
 *
 * Which rank computes an expert's output never changes the output: each (token, expert) row is computed by the
 * same kernel on the same inputs on whichever GPU owns it, and gathered back exactly (cuda_ep.c). */
#ifndef DSV4_MODEL_EXPERT_PLACE_H
#define DSV4_MODEL_EXPERT_PLACE_H

/* What a GPU writes for the output rows of an expert it does not hold, before the rows of all GPUs are summed
 * onto rank 0: -0.0f is the one additive identity of IEEE arithmetic (x + -0.0f == x bit for bit for every x, +0
 * and -0 included; +0.0f would turn a -0 row into +0), so the sum is the owner's row whatever order it is
 * added in (tests/unit/test_expert_place.c). */
#define EP_ABSENT_ROW (-0.0f)

/* The first expert of rank r (r = n_ranks gives E). */
int expert_first(int E, int n_ranks, int r);
/* The rank that owns expert e (0 <= e < E). */
int expert_owner(int E, int n_ranks, int e);
#endif
