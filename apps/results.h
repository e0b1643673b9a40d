/* What a layer run gives back on each rank, its outputs and gradients and
 * the routing it chose, and what the programs do with it: compare two
 * runs, check one against the double-precision reference, write it out. */
#ifndef RMOE_RESULTS_H
#define RMOE_RESULTS_H

#include <stdint.h>

#include "problem.h"
#include "relaymoe/relaymoe.h"

/* The outputs of one run on this rank. */
struct rmoe_results {
	float *y, *dx;               /* [T, H] */
	float *dw_router;            /* [H, E], this rank's part */
	float *dw_gate, *dw_up, *dw_down; /* owned experts */
	float *dws_gate, *dws_up, *dws_down;
	float *dw_sgate;             /* [H], this rank's part, when shared_gated */
	int32_t *topk_idx;           /* [T, K] */
};
int rmoe_results_alloc(struct rmoe_results *r, const struct rmoe_problem *p);
void rmoe_results_free(struct rmoe_results *r);
/* The layer's gradients and routing into r (its y and dx come from the
 * passes themselves); 0 or the layer's RMOE_E* code. */
int rmoe_results_collect(struct rmoe_results *r, const struct rmoe_problem *p, rmoe_layer *layer);

/* One layer of cfg on ctx with p's tensors: create, apply, forward,
 * backward, collect into r (allocated here; the caller frees it, whatever
 * the outcome), its statistics into st (may be NULL), destroy. Every step
 * agreed over the ranks; 0 or the first RMOE_E* code. */
int rmoe_problem_run(rmoe_ctx *ctx, const struct rmoe_layer_config *cfg, const struct rmoe_problem *p,
                     struct rmoe_results *r, struct rmoe_layer_stats *st);

/* Largest relative norm difference between two runs' tensors, over ranks. */
double rmoe_results_max_rel_diff(const struct rmoe_results *a, const struct rmoe_results *b,
                                 const struct rmoe_problem *p, const char **worst);

/* Compare with the reference on rank 0 (gathers everything there). Returns
 * the largest relative error over all tensors, on every rank; worst names it. */
double rmoe_results_check(const struct rmoe_results *r, const struct rmoe_problem *p,
                          const char **worst, int64_t *near_ties);

/* Rank 0 writes inputs and outputs as .npy into dir (created if needed). */
int rmoe_results_dump(const struct rmoe_results *r, const struct rmoe_problem *p, const char *dir);

#endif
