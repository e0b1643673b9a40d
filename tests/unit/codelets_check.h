/* What the codelet tests (test_codelets*.c) share: seeded inputs, vector
 * handles, relative errors, the routing and the expert computed in double
 * precision, and the group set-up that picks the CPU or the CUDA worker.
 * Include after <cmocka.h>. */
#ifndef RMOE_TEST_CODELETS_CHECK_H
#define RMOE_TEST_CODELETS_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <starpu.h>

#include "rmoe_codelets.h"

/* fp32 kernels against double loops: a few units of fp32 rounding over sums
 * of at most a few hundred terms. */
#define TOL_F32 1e-5
/* One fp32 multiply or add per element. */
#define TOL_ONE_OP 1e-6

#define assert_rel_err(err, tol)                                                        \
	do {                                                                            \
		double rel_err_ = (err);                                                \
		if (!(rel_err_ <= (tol)))                                               \
			fail_msg("%s = %.3g, above the tolerance %.3g", #err, rel_err_, \
			         (double)(tol));                                        \
	} while (0)

/* Every insertion here goes through the library's insert functions, as
 * the graphs' do, and must succeed. */
#define INSERT(call) assert_int_equal((call), 0)

/* ---- seeded inputs ------------------------------------------------------ */

struct rng {
	uint64_t state;
};

/* [0, 1) */
double rng_unit(struct rng *r);
int64_t rng_below(struct rng *r, int64_t n);
/* n values uniform in [-scale, scale), away from zero (malloc'd). */
float *rng_floats(struct rng *r, int64_t n, double scale);
/* calloc that fails the test when it fails; n = 0 gives one element. */
void *xcalloc(int64_t n, size_t size);

/* Task options naming the task (one static copy: use before the next call). */
const struct rmoe_task_opts *opts(const char *name);

/* ---- StarPU helpers ----------------------------------------------------- */

starpu_data_handle_t vec_f(float *ptr, int64_t n);
starpu_data_handle_t vec_i(int32_t *ptr, int64_t n);
/* A temporary (home node -1), freed by StarPU after its last task. */
starpu_data_handle_t vec_tmp(int64_t n);
void unregister_all(starpu_data_handle_t *h, int n);
void wait_all(void);

/* ---- comparisons -------------------------------------------------------- */

/* Relative norm error of a against ref. */
double rel_err_d(const float *a, const double *ref, int64_t n);
double rel_err_f(const float *a, const float *b, int64_t n);

/* ---- reference routing, in double ------------------------------------- */

void ref_softmax(const float *x, const float *w_router, int64_t H, int64_t E, double *p);
void ref_topk_weights(const double *p, const int32_t *idx, int64_t K, int norm, double *w);
/* Softmax, top-k (descending, ties to the lower expert) and its weights. */
void ref_route(const float *x, const float *w_router, int64_t T, int64_t H, int64_t E, int64_t K, int norm,
               double *probs, int32_t *idx, double *tw);

/* K distinct experts per token from the allowed ones (NULL: all); skew > 0
 * favours the first allowed experts (uneven routing). */
void random_routing(struct rng *r, int64_t T, int64_t K, int64_t E, const int *allowed, int skew,
                    int32_t *idx);

/* Stable sort of the pairs by expert, the obvious way. */
void ref_dispatch(const int32_t *idx, int64_t T, int64_t K, int64_t E, int32_t *pair_order, int32_t *counts);

/* A routing and its pair order, with the slice of experts [e0, e1). */
struct slice_case {
	int64_t T, K, E, H;
	int32_t *idx, *pair_order, *counts;
	float *topk_w;
	int64_t first, count;
};

void slice_case_init(struct slice_case *c, struct rng *r, int64_t T, int64_t K, int64_t E, int64_t H,
                     int64_t e0, int64_t e1, const int *allowed, int skew);
void slice_case_free(struct slice_case *c);

/* ---- reference expert, in double -------------------------------------- */

struct ref_expert {
	const float *gate, *up, *down; /* [H][F], [H][F], [F][H] */
	int64_t H, F;
};

/* Expert e of a partition of ne experts (gates, then ups, then downs). */
struct ref_expert ref_expert_of(const float *partition, int64_t ne, int64_t H, int64_t F, int64_t e);
double ref_sigmoid(double g);
/* gate, up, act [F]; out [H] (may be NULL). */
void ref_expert_fwd(const struct ref_expert *x, const float *row, double *gate, double *up, double *act,
                    double *out);

struct rmoe_expert_shape expert_shape(int64_t H, int64_t F, int64_t ne, const int64_t *rows_per_expert);

/* ---- group set-up ------------------------------------------------------- */

/* RMOE_TEST_DEVICE=cuda runs every test on one CUDA worker and no CPU
 * worker (the gpu label): the CUDA codelets against the same double loops,
 * at the same tolerances. Without a CUDA worker that run is skipped (77). */
extern int on_cuda;

int codelets_group_setup(void **state);

#endif
