/* Unit tests of the expert codelets on seeded random inputs against the
 * expert computed in double precision: the grouped FFN forward and its
 * recompute (uneven rows, empty experts), and the backwards (pair-weighted,
 * pair rows, preweighted), as one chunk and as two. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "cmocka_main.h"
#include "codelets_check.h"
#include "codelets_fixture.h"

/* The two modes of the expert backward. */
/* PAIR_ROWS: pair-weighted without a dx target (the lean all-to-all). */
enum { PAIR_WEIGHTED, PREWEIGHTED, PAIR_ROWS };

/* ---- expert FFN and recompute ----------------------------------------- */

static void check_expert_ffn(uint64_t seed, int64_t ne, const int64_t *rows_per_expert)
{
	const int64_t H = 12, F = 10;
	struct rng r = {seed};
	struct rmoe_expert_shape a = expert_shape(H, F, ne, rows_per_expert);
	const int64_t m = a.rows;
	float *x = rng_floats(&r, m * H, 1.0);
	float *w = rng_floats(&r, 3 * ne * H * F, 1.0 / sqrt((double)H));
	float *work = rng_floats(&r, 3 * m * F, 1.0);
	float *out = rng_floats(&r, m * H, 1.0);
	float *work4 = rng_floats(&r, 4 * m * F, 1.0);
	float *work3 = rng_floats(&r, 3 * m * F, 1.0);

	starpu_data_handle_t h[6] = {vec_f(x, m * H),   vec_f(w, 3 * ne * H * F), vec_f(work, 3 * m * F),
	                             vec_f(out, m * H), vec_f(work4, 4 * m * F),  vec_f(work3, 3 * m * F)};
	INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &a, h[0], h[1], h[2], h[3]));
	/* §3.3 recompute, into a forward workspace and a pair-weighted backward one. */
	INSERT(rmoe_insert_expert_ffn(opts("recompute"), &a, h[0], h[1], h[4], NULL));
	INSERT(rmoe_insert_expert_ffn(opts("recompute"), &a, h[0], h[1], h[5], NULL));
	wait_all();
	unregister_all(h, 6);

	double *ref_work = xcalloc(3 * m * F, sizeof(double)), *ref_out = xcalloc(m * H, sizeof(double));
	int64_t o = 0;
	for (int64_t e = 0; e < ne; e++) {
		struct ref_expert ex = ref_expert_of(w, ne, H, F, e);
		for (int64_t i = o; i < o + rows_per_expert[e]; i++)
			ref_expert_fwd(&ex, x + i * H, ref_work + i * F, ref_work + (m + i) * F,
			               ref_work + (2 * m + i) * F, ref_out + i * H);
		o += rows_per_expert[e];
	}
	assert_rel_err(rel_err_d(work, ref_work, 3 * m * F), TOL_F32);
	assert_rel_err(rel_err_d(out, ref_out, m * H), TOL_F32);
	assert_rel_err(rel_err_d(work4, ref_work, 3 * m * F), TOL_F32);
	assert_rel_err(rel_err_d(work3, ref_work, 3 * m * F), TOL_F32);

	free(x);
	free(w);
	free(work);
	free(out);
	free(work4);
	free(work3);
	free(ref_work);
	free(ref_out);
}

static void test_codelets_expert_ffn_grouped_uneven(void **state)
{
	(void)state;
	const int64_t uneven[4] = {5, 0, 9, 3};
	check_expert_ffn(61, 4, uneven);
}

static void test_codelets_expert_ffn_all_rows_one_expert(void **state)
{
	(void)state;
	const int64_t one[3] = {0, 14, 0};
	check_expert_ffn(62, 3, one);
}

/* ---- expert backward ---------------------------------------------------- */

/* The backward of g * expert(row) for output gradient dy: dg, dx [H], and
 * the expert's weight gradients added into dw_gate/dw_up [H][F], dw_down [F][H]. */
static double ref_expert_bwd(const struct ref_expert *x, const float *row, const float *dy, double g,
                             double *dx, double *dw_gate, double *dw_up, double *dw_down)
{
	const int64_t H = x->H, F = x->F;
	double *gate = calloc((size_t)(5 * F), sizeof(double));
	assert_non_null(gate);
	double *up = gate + F, *act = gate + 2 * F, *dpre_gate = gate + 3 * F, *dpre_up = gate + 4 * F;
	ref_expert_fwd(x, row, gate, up, act, NULL);
	double dg = 0.0;
	for (int64_t j = 0; j < F; j++) {
		double u = 0.0;
		for (int64_t h = 0; h < H; h++)
			u += (double)dy[h] * x->down[j * H + h];
		dg += u * act[j];
		double dact = g * u, s = ref_sigmoid(gate[j]);
		dpre_up[j] = dact * gate[j] * s;
		dpre_gate[j] = dact * up[j] * s * (1.0 + gate[j] * (1.0 - s));
		for (int64_t h = 0; h < H; h++)
			dw_down[j * H + h] += g * act[j] * dy[h];
	}
	for (int64_t h = 0; h < H; h++) {
		double d = 0.0;
		for (int64_t j = 0; j < F; j++) {
			dw_gate[h * F + j] += (double)row[h] * dpre_gate[j];
			dw_up[h * F + j] += (double)row[h] * dpre_up[j];
			d += dpre_gate[j] * x->gate[h * F + j] + dpre_up[j] * x->up[h * F + j];
		}
		dx[h] = d;
	}
	free(gate);
	return dg;
}

/* The local pairs of one partition (experts [e0, e0 + ne) of E), their
 * gathered rows, and the reference gradients. */
struct bwd_case {
	struct slice_case s;
	int64_t e0, ne, F, m;
	int64_t *rows_per_expert;
	float *w, *x, *dy;         /* partition weights, token x and dy [T*H] */
	float *x_rows, *dy_rows, *dout_rows; /* [m*H] gathered; dout = g*dy */
	double *ref_dx, *ref_dg, *ref_dw; /* [m*H], [T*K] (slice pairs), [3*ne*H*F] */
};

static void bwd_case_init(struct bwd_case *c, uint64_t seed)
{
	const int64_t T = 15, K = 3, E = 8, H = 12, F = 10;
	/* Expert 5 receives no token: its gradients must be zero. */
	const int allowed[8] = {1, 1, 1, 1, 1, 0, 1, 1};
	struct rng r = {seed};
	c->e0 = 4;
	c->ne = 4;
	c->F = F;
	slice_case_init(&c->s, &r, T, K, E, H, c->e0, c->e0 + c->ne, allowed, 0);
	c->m = c->s.count;
	c->rows_per_expert = xcalloc(c->ne, sizeof(int64_t));
	for (int64_t e = 0; e < c->ne; e++)
		c->rows_per_expert[e] = c->s.counts[c->e0 + e];
	assert_int_equal(c->rows_per_expert[1], 0);
	c->w = rng_floats(&r, 3 * c->ne * H * F, 1.0 / sqrt((double)H));
	c->x = rng_floats(&r, T * H, 1.0);
	c->dy = rng_floats(&r, T * H, 1.0);
	c->x_rows = xcalloc(c->m * H, sizeof(float));
	c->dy_rows = xcalloc(c->m * H, sizeof(float));
	c->dout_rows = xcalloc(c->m * H, sizeof(float));
	c->ref_dx = xcalloc(c->m * H, sizeof(double));
	c->ref_dg = xcalloc(T * K, sizeof(double));
	c->ref_dw = xcalloc(3 * c->ne * H * F, sizeof(double));
	int64_t o = 0;
	for (int64_t e = 0; e < c->ne; e++) {
		struct ref_expert ex = ref_expert_of(c->w, c->ne, H, F, e);
		double *dw_gate = c->ref_dw + e * H * F, *dw_up = c->ref_dw + (c->ne + e) * H * F;
		double *dw_down = c->ref_dw + (2 * c->ne + e) * H * F;
		for (int64_t i = o; i < o + c->rows_per_expert[e]; i++) {
			int64_t p = c->s.pair_order[c->s.first + i], t = p / K;
			float g = c->s.topk_w[p];
			memcpy(c->x_rows + i * H, c->x + t * H, (size_t)H * sizeof(float));
			memcpy(c->dy_rows + i * H, c->dy + t * H, (size_t)H * sizeof(float));
			for (int64_t j = 0; j < H; j++)
				c->dout_rows[i * H + j] = g * c->dy[t * H + j];
			c->ref_dg[p] = ref_expert_bwd(&ex, c->x + t * H, c->dy + t * H, g, c->ref_dx + i * H,
			                              dw_gate, dw_up, dw_down);
		}
		o += c->rows_per_expert[e];
	}
}

static void bwd_case_free(struct bwd_case *c)
{
	slice_case_free(&c->s);
	free(c->rows_per_expert);
	free(c->w);
	free(c->x);
	free(c->dy);
	free(c->x_rows);
	free(c->dy_rows);
	free(c->dout_rows);
	free(c->ref_dx);
	free(c->ref_dg);
	free(c->ref_dw);
}

/* One expert_bwd task for rows [r0, r1) of the slice: its workspace
 * recomputed (pair-weighted) or saved by a forward (preweighted), the graph's
 * way. */
/* Pair-weighted: x_rows is consumed (the task leaves the rows' dx there) and
 * dx is the [T*H] accumulator; pair rows: the same without the accumulator
 * (h_dx_acc NULL), the result being x_rows; preweighted: dx_rows receives
 * the rows' dx. */
static void submit_expert_bwd_chunk(const struct bwd_case *c, int mode, int64_t r0, int64_t r1,
                                    int accumulate, starpu_data_handle_t h_w,
                                    starpu_data_handle_t h_pairs, starpu_data_handle_t h_topk_w,
                                    starpu_data_handle_t h_dg, starpu_data_handle_t h_dw, float *x_rows,
                                    starpu_data_handle_t h_dx_acc, float *dx_rows, starpu_data_handle_t *result)
{
	const int64_t H = c->s.H, F = c->F, n = r1 - r0;
	int64_t *chunk_rows = xcalloc(c->ne, sizeof(int64_t));
	int64_t o = 0;
	for (int64_t e = 0; e < c->ne; e++) {
		int64_t end = o + c->rows_per_expert[e];
		int64_t lo = o > r0 ? o : r0, hi = end < r1 ? end : r1;
		chunk_rows[e] = hi > lo ? hi - lo : 0;
		o += c->rows_per_expert[e];
	}
	struct rmoe_expert_shape a = expert_shape(H, F, c->ne, chunk_rows);
	assert_int_equal(a.rows, n);

	starpu_data_handle_t h_x = vec_f(x_rows + r0 * H, n * H);
	starpu_data_handle_t h_dx = NULL;
	if (mode != PREWEIGHTED) {
		starpu_data_handle_t h_dy = vec_f(c->dy_rows + r0 * H, n * H);
		starpu_data_handle_t h_work = vec_tmp(4 * n * F);
		INSERT(rmoe_insert_expert_ffn(opts("recompute"), &a, h_x, h_w, h_work, NULL));
		INSERT(rmoe_insert_expert_bwd_pairs(opts("expert-bwd"), &a, c->s.first + r0, c->s.K, accumulate, h_x,
		                                    h_dy, h_w, h_pairs, h_topk_w, h_work, h_dx_acc, h_dg, h_dw));
		starpu_data_unregister_submit(h_work);
		starpu_data_unregister_submit(h_dy);
	} else {
		h_dx = vec_f(dx_rows + r0 * H, n * H);
		starpu_data_handle_t h_dout = vec_f(c->dout_rows + r0 * H, n * H);
		starpu_data_handle_t h_work = vec_tmp(3 * n * F), h_out = vec_tmp(n * H);
		INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &a, h_x, h_w, h_work, h_out));
		starpu_data_unregister_submit(h_out);
		INSERT(rmoe_insert_expert_bwd_preweighted(opts("expert-bwd"), &a, accumulate, h_x, h_dout, h_w, h_work,
		                                          h_dx, h_dw));
		starpu_data_unregister_submit(h_work);
		starpu_data_unregister_submit(h_dout);
	}
	/* The handle that holds the chunk's result (the consumed x rows, or
	 * dx_rows) is unregistered by the caller once every task is done: an
	 * asynchronous unregistration may bring a device copy home after
	 * starpu_task_wait_for_all returns, and the check would read the host
	 * copy's old values (seen on a CUDA worker). */
	if (h_dx) {
		starpu_data_unregister_submit(h_x);
		*result = h_dx;
	} else {
		*result = h_x;
	}
	free(chunk_rows);
}

/* The whole slice as one chunk (split = 0) or two, the second accumulating.
 * dx: the rows' dx (preweighted and pair rows, m*H) or the [T*H]
 * accumulator they are added into (pair-weighted). */
static void run_expert_bwd(const struct bwd_case *c, int mode, int64_t split, float *dx, float *dg,
                           float *dw)
{
	const int64_t P = c->s.T * c->s.K, nw = 3 * c->ne * c->s.H * c->F, H = c->s.H;
	starpu_data_handle_t h[6] = {vec_f(c->w, nw), vec_i(c->s.pair_order, P), vec_f(c->s.topk_w, P),
	                             vec_f(dg, P), vec_f(dw, nw), NULL};
	/* The pair-weighted task consumes its x rows: give it a copy. */
	float *x_rows = xcalloc(c->m * H, sizeof(float));
	memcpy(x_rows, c->x_rows, (size_t)(c->m * H) * sizeof(float));
	if (mode == PAIR_WEIGHTED)
		h[5] = vec_f(dx, c->s.T * H);
	starpu_data_handle_t results[2];
	if (split == 0) {
		submit_expert_bwd_chunk(c, mode, 0, c->m, 0, h[0], h[1], h[2], h[3], h[4], x_rows, h[5], dx, &results[0]);
	} else {
		submit_expert_bwd_chunk(c, mode, 0, split, 0, h[0], h[1], h[2], h[3], h[4], x_rows, h[5], dx,
		                        &results[0]);
		submit_expert_bwd_chunk(c, mode, split, c->m, 1, h[0], h[1], h[2], h[3], h[4], x_rows, h[5], dx,
		                        &results[1]);
	}
	wait_all();
	unregister_all(results, split == 0 ? 1 : 2);
	unregister_all(h, mode == PAIR_WEIGHTED ? 6 : 5);
	/* Pair rows: the consumed x rows are the result. */
	if (mode == PAIR_ROWS)
		memcpy(dx, x_rows, (size_t)(c->m * H) * sizeof(float));
	free(x_rows);
}

static void check_expert_bwd(int mode)
{
	struct bwd_case c;
	bwd_case_init(&c, 71 + (uint64_t)mode);
	const int64_t H = c.s.H, F = c.F, P = c.s.T * c.s.K, nw = 3 * c.ne * H * F;
	struct rng r = {81};
	float *dg_init = rng_floats(&r, P, 1.0);

	/* Garbage in the W outputs: an expert with no rows must come out zero.
	 * Pair-weighted adds each row's dx at its token into a [T*H]
	 * accumulator that starts from seeded values. */
	const int pw = mode == PAIR_WEIGHTED;
	const int64_t ndx = pw ? c.s.T * H : c.m * H;
	float *dx_init = rng_floats(&r, ndx, 1.0);
	double *want_dx = xcalloc(ndx, sizeof(double));
	if (pw) {
		for (int64_t i = 0; i < ndx; i++)
			want_dx[i] = dx_init[i];
		for (int64_t i = 0; i < c.m; i++) {
			int64_t t = c.s.pair_order[c.s.first + i] / c.s.K;
			for (int64_t j = 0; j < H; j++)
				want_dx[t * H + j] += c.ref_dx[i * H + j];
		}
	} else {
		memcpy(want_dx, c.ref_dx, (size_t)ndx * sizeof(double));
	}
	float *dx1 = xcalloc(ndx, sizeof(float)), *dg1 = xcalloc(P, sizeof(float));
	float *dw1 = rng_floats(&r, nw, 1.0);
	memcpy(dx1, dx_init, (size_t)ndx * sizeof(float));
	memcpy(dg1, dg_init, (size_t)P * sizeof(float));
	run_expert_bwd(&c, mode, 0, dx1, dg1, dw1);

	assert_rel_err(rel_err_d(dx1, want_dx, ndx), TOL_F32);
	assert_rel_err(rel_err_d(dw1, c.ref_dw, nw), TOL_F32);
	for (int64_t e = 0; e < c.ne; e++)
		if (c.rows_per_expert[e] == 0)
			for (int64_t part = 0; part < 3; part++)
				for (int64_t i = 0; i < H * F; i++)
					assert_true(dw1[(part * c.ne + e) * H * F + i] == 0.0f);
	if (mode != PREWEIGHTED) {
		/* The slice's pairs written, every other pair untouched. */
		int64_t n_slice = 0;
		double num = 0.0, den = 0.0;
		for (int64_t p = 0; p < P; p++) {
			int in_slice = 0;
			for (int64_t i = 0; i < c.m; i++)
				in_slice |= c.s.pair_order[c.s.first + i] == p;
			if (in_slice) {
				num += (dg1[p] - c.ref_dg[p]) * (dg1[p] - c.ref_dg[p]);
				den += c.ref_dg[p] * c.ref_dg[p];
				n_slice++;
			} else {
				assert_true(dg1[p] == dg_init[p]);
			}
		}
		assert_int_equal(n_slice, c.m);
		assert_rel_err(sqrt(num / den), TOL_F32);
	} else {
		assert_memory_equal(dg1, dg_init, (size_t)P * sizeof(float));
	}

	/* Two chunks, split inside an expert's rows, the second accumulating:
	 * the same as one chunk. */
	float *dx2 = xcalloc(ndx, sizeof(float)), *dg2 = xcalloc(P, sizeof(float));
	float *dw2 = rng_floats(&r, nw, 1.0);
	memcpy(dx2, dx_init, (size_t)ndx * sizeof(float));
	memcpy(dg2, dg_init, (size_t)P * sizeof(float));
	int64_t split = c.rows_per_expert[0] + c.rows_per_expert[1] + c.rows_per_expert[2] / 2;
	assert_true(split > 0 && split < c.m);
	run_expert_bwd(&c, mode, split, dx2, dg2, dw2);
	assert_rel_err(rel_err_f(dw2, dw1, nw), TOL_F32);
	assert_rel_err(rel_err_d(dw2, c.ref_dw, nw), TOL_F32);
	assert_rel_err(rel_err_f(dx2, dx1, ndx), TOL_F32);
	assert_rel_err(rel_err_f(dg2, dg1, P), TOL_F32);

	free(dg_init);
	free(dx_init);
	free(want_dx);
	free(dx1);
	free(dg1);
	free(dw1);
	free(dx2);
	free(dg2);
	free(dw2);
	bwd_case_free(&c);
}

static void test_codelets_expert_bwd_pair_weighted(void **state)
{
	(void)state;
	check_expert_bwd(PAIR_WEIGHTED);
}

static void test_codelets_expert_bwd_pair_rows(void **state)
{
	(void)state;
	check_expert_bwd(PAIR_ROWS);
}

static void test_codelets_expert_bwd_preweighted(void **state)
{
	(void)state;
	check_expert_bwd(PREWEIGHTED);
}

RMOE_TEST_MAIN(codelets_group_setup, codelets_fixture_stop,
               cmocka_unit_test(test_codelets_expert_ffn_grouped_uneven),
               cmocka_unit_test(test_codelets_expert_ffn_all_rows_one_expert),
               cmocka_unit_test(test_codelets_expert_bwd_pair_weighted),
               cmocka_unit_test(test_codelets_expert_bwd_pair_rows),
               cmocka_unit_test(test_codelets_expert_bwd_preweighted))
