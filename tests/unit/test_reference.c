/* The reference is what every other implementation is judged by, so it is
 * checked against things that do not share its code: its forward against a
 * direct transcription of the definition, its gradients against central
 * differences of L = <dy, y>, its routing against constructed ties. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_main.h"
#include "rmoe_reference.h"
#include "seeded.h"

#define SEED 20240611u

/* One layer with its inputs and every buffer a test needs. */
struct moe_case {
	struct rmoe_ref_layer layer;
	int64_t tokens;
	float *x, *dy;
	float *w_router, *w_gate, *w_up, *w_down, *ws_gate, *ws_up, *ws_down;
	float *probs, *topk_w, *y;
	int32_t *topk_idx;
};

static float *seeded_floats(int64_t n, uint64_t stream, float scale)
{
	float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(*v));
	assert_non_null(v);
	rmoe_seeded_uniform(v, n, SEED, stream, 0, scale);
	return v;
}

static struct moe_case *case_new(int64_t tokens, int64_t hidden, int64_t ffn, int64_t experts,
                                 int64_t topk, int norm_topk, int64_t shared_ffn)
{
	struct moe_case *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	const int64_t T = tokens, H = hidden, F = ffn, E = experts, K = topk, Fs = shared_ffn;
	c->tokens = T;
	c->x = seeded_floats(T * H, RMOE_STREAM_X, 1.0f);
	c->dy = seeded_floats(T * H, RMOE_STREAM_DY, 1.0f);
	/* Router logits of order one, so the top-k gaps are wide compared with
	 * the finite-difference steps. */
	c->w_router = seeded_floats(H * E, RMOE_STREAM_W_ROUTER, 1.0f);
	c->w_gate = seeded_floats(E * H * F, RMOE_STREAM_W_GATE, 0.5f);
	c->w_up = seeded_floats(E * H * F, RMOE_STREAM_W_UP, 0.5f);
	c->w_down = seeded_floats(E * F * H, RMOE_STREAM_W_DOWN, 0.5f);
	if (Fs > 0) {
		c->ws_gate = seeded_floats(H * Fs, RMOE_STREAM_WS_GATE, 0.5f);
		c->ws_up = seeded_floats(H * Fs, RMOE_STREAM_WS_UP, 0.5f);
		c->ws_down = seeded_floats(Fs * H, RMOE_STREAM_WS_DOWN, 0.5f);
	}
	c->probs = calloc((size_t)(T * E), sizeof(float));
	c->topk_w = calloc((size_t)(T * K), sizeof(float));
	c->topk_idx = calloc((size_t)(T * K), sizeof(int32_t));
	c->y = calloc((size_t)(T * H), sizeof(float));
	assert_true(c->probs && c->topk_w && c->topk_idx && c->y);
	c->layer = (struct rmoe_ref_layer){
		.hidden = H, .ffn = F, .experts = E, .topk = K, .norm_topk = norm_topk,
		.shared_ffn = Fs, .w_router = c->w_router, .w_gate = c->w_gate, .w_up = c->w_up,
		.w_down = c->w_down, .ws_gate = c->ws_gate, .ws_up = c->ws_up, .ws_down = c->ws_down,
	};
	return c;
}

static void case_free(struct moe_case *c)
{
	free(c->x);
	free(c->dy);
	free(c->w_router);
	free(c->w_gate);
	free(c->w_up);
	free(c->w_down);
	free(c->ws_gate);
	free(c->ws_up);
	free(c->ws_down);
	free(c->probs);
	free(c->topk_w);
	free(c->topk_idx);
	free(c->y);
	free(c);
}

static void case_run(struct moe_case *c)
{
	assert_int_equal(rmoe_ref_route(&c->layer, c->tokens, c->x, c->probs, c->topk_idx,
	                                c->topk_w, NULL, 0.0),
	                 0);
	rmoe_ref_forward(&c->layer, c->tokens, c->x, c->topk_idx, c->topk_w, c->y);
}

/* ---- forward against the definition ------------------------------------- */

static double silu(double a)
{
	return a / (1.0 + exp(-a));
}

/* expert(x)[h], written as the definition reads, one output at a time. */
static double definition_expert(int64_t H, int64_t F, const float *x, const float *gate,
                                const float *up, const float *down, int64_t h)
{
	double out = 0.0;
	for (int64_t f = 0; f < F; f++) {
		double a = 0.0, u = 0.0;
		for (int64_t i = 0; i < H; i++) {
			a += (double)x[i] * gate[i * F + f];
			u += (double)x[i] * up[i * F + f];
		}
		out += silu(a) * u * down[f * H + h];
	}
	return out;
}

static void check_forward_against_definition(struct moe_case *c)
{
	const struct rmoe_ref_layer *L = &c->layer;
	const int64_t H = L->hidden, F = L->ffn, E = L->experts, K = L->topk, Fs = L->shared_ffn;
	case_run(c);
	double *p = malloc((size_t)E * sizeof(*p));
	int32_t *order = malloc((size_t)E * sizeof(*order));
	assert_true(p && order);
	for (int64_t t = 0; t < c->tokens; t++) {
		const float *x = c->x + t * H;
		double max = -INFINITY, sum = 0.0;
		for (int64_t e = 0; e < E; e++) {
			p[e] = 0.0;
			for (int64_t h = 0; h < H; h++)
				p[e] += (double)x[h] * L->w_router[h * E + e];
			max = fmax(max, p[e]);
		}
		for (int64_t e = 0; e < E; e++)
			sum += p[e] = exp(p[e] - max);
		for (int64_t e = 0; e < E; e++) {
			p[e] /= sum;
			/* float32 rounding of a value in (0, 1] */
			assert_true(fabs(c->probs[t * E + e] - p[e]) <= 1e-7 * p[e] + 1e-12);
		}
		/* Stable insertion sort by descending probability: ties keep the
		 * lower expert first. */
		for (int32_t e = 0; e < E; e++) {
			int32_t j = e;
			for (; j > 0 && p[order[j - 1]] < p[e]; j--)
				order[j] = order[j - 1];
			order[j] = e;
		}
		double selected = 0.0;
		for (int64_t k = 0; k < K; k++)
			selected += p[order[k]];
		for (int64_t k = 0; k < K; k++) {
			assert_int_equal(c->topk_idx[t * K + k], order[k]);
			const double g = L->norm_topk ? p[order[k]] / selected : p[order[k]];
			assert_true(fabs(c->topk_w[t * K + k] - g) <= 1e-7 * g);
		}
		for (int64_t h = 0; h < H; h++) {
			double y = 0.0, magnitude = 0.0;
			for (int64_t k = 0; k < K; k++) {
				const int64_t e = order[k];
				const double g = L->norm_topk ? p[e] / selected : p[e];
				const double term = g * definition_expert(H, F, x, L->w_gate + e * H * F,
				                                          L->w_up + e * H * F,
				                                          L->w_down + e * F * H, h);
				y += term;
				magnitude += fabs(term);
			}
			if (Fs > 0) {
				const double term =
					definition_expert(H, Fs, x, L->ws_gate, L->ws_up, L->ws_down, h);
				y += term;
				magnitude += fabs(term);
			}
			/* The float32 rounding of g (an input of the forward) and of y:
			 * 2^-24 of each term, bounded by 1e-7 of their magnitudes. */
			assert_true(fabs(c->y[t * H + h] - y) <= 1e-7 * magnitude + 1e-7 * fabs(y));
		}
	}
	free(order);
	free(p);
}

static void test_reference_forward_matches_definition(void **state)
{
	(void)state;
	struct moe_case *c = case_new(7, 10, 6, 6, 3, 1, 5);
	check_forward_against_definition(c);
	case_free(c);
	c = case_new(7, 10, 6, 6, 3, 0, 0);
	check_forward_against_definition(c);
	case_free(c);
}

/* K = E: every expert, in descending order; the forward is the dense mixture. */
static void test_reference_all_experts_selected(void **state)
{
	(void)state;
	struct moe_case *c = case_new(6, 8, 5, 4, 4, 1, 0);
	check_forward_against_definition(c);
	for (int64_t t = 0; t < c->tokens; t++) {
		double sum = 0.0;
		for (int64_t k = 0; k < 4; k++) {
			sum += c->topk_w[t * 4 + k];
			if (k > 0)
				assert_true(c->probs[t * 4 + c->topk_idx[t * 4 + k - 1]] >=
				            c->probs[t * 4 + c->topk_idx[t * 4 + k]]);
		}
		assert_true(fabs(sum - 1.0) <= 1e-6);
	}
	case_free(c);
}

/* ---- gradients against central differences ------------------------------ */

static double loss(struct moe_case *c, const int32_t *expect_idx)
{
	case_run(c);
	const int64_t n = c->tokens * c->layer.topk;
	/* A selection change would make L jump: the difference quotient would
	 * measure that, not the gradient. */
	if (memcmp(c->topk_idx, expect_idx, (size_t)n * sizeof(*expect_idx)) != 0)
		fail_msg("a finite-difference step changed the top-k selection; pick another seed");
	double l = 0.0;
	for (int64_t i = 0; i < c->tokens * c->layer.hidden; i++)
		l += (double)c->dy[i] * c->y[i];
	return l;
}

/* dL/dv[i] by central differences with Richardson extrapolation:
 * (4 D(h/2) - D(h)) / 3 cancels the h^2 term, leaving the float32 rounding of
 * y (about 1e-7 of L, divided by the step) as the main error. Steps are taken
 * in float, so each quotient divides by the step actually taken. */
static void finite_differences(struct moe_case *c, float *v, int64_t n, const int32_t *idx,
                               double *fd)
{
	const float step = 1e-2f;
	for (int64_t i = 0; i < n; i++) {
		const float saved = v[i];
		double quotient[2];
		for (int s = 0; s < 2; s++) {
			const float h = s ? step / 2 : step;
			const float plus = saved + h, minus = saved - h;
			v[i] = plus;
			const double l_plus = loss(c, idx);
			v[i] = minus;
			const double l_minus = loss(c, idx);
			quotient[s] = (l_plus - l_minus) / ((double)plus - (double)minus);
		}
		v[i] = saved;
		fd[i] = (4.0 * quotient[1] - quotient[0]) / 3.0;
	}
}

/* ||analytic - fd|| <= rel * ||fd|| + abs_tol * sqrt(n). */
static void check_gradient(const char *name, struct moe_case *c, float *v, int64_t n,
                           const float *analytic, const int32_t *idx)
{
	/* The differences land within 1e-6 to 1e-4 (relative) of the reference's
	 * gradients; a wrong term errs by percents or more. */
	const double rel = 1e-3, abs_tol = 1e-5;
	double *fd = malloc((size_t)n * sizeof(*fd));
	assert_non_null(fd);
	finite_differences(c, v, n, idx, fd);
	double diff = 0.0, norm = 0.0;
	for (int64_t i = 0; i < n; i++) {
		diff += (analytic[i] - fd[i]) * (analytic[i] - fd[i]);
		norm += fd[i] * fd[i];
	}
	diff = sqrt(diff);
	norm = sqrt(norm);
	free(fd);
	if (!(diff <= rel * norm + abs_tol * sqrt((double)n)))
		fail_msg("%s: ||analytic - finite difference|| = %.3g, ||finite difference|| = %.3g, "
		         "allowed %.3g",
		         name, diff, norm, rel * norm + abs_tol * sqrt((double)n));
}

static void check_gradients(int64_t tokens, int64_t hidden, int64_t ffn, int64_t experts,
                            int64_t topk, int norm_topk, int64_t shared_ffn)
{
	struct moe_case *c = case_new(tokens, hidden, ffn, experts, topk, norm_topk, shared_ffn);
	const int64_t T = tokens, H = hidden, F = ffn, E = experts, K = topk, Fs = shared_ffn;
	case_run(c);
	int32_t *idx = malloc((size_t)(T * K) * sizeof(*idx));
	assert_non_null(idx);
	memcpy(idx, c->topk_idx, (size_t)(T * K) * sizeof(*idx));

	struct rmoe_ref_grads g = {
		.dx = malloc((size_t)(T * H) * sizeof(float)),
		.dw_router = malloc((size_t)(H * E) * sizeof(float)),
		.dw_gate = malloc((size_t)(E * H * F) * sizeof(float)),
		.dw_up = malloc((size_t)(E * H * F) * sizeof(float)),
		.dw_down = malloc((size_t)(E * F * H) * sizeof(float)),
	};
	if (Fs > 0) {
		g.dws_gate = malloc((size_t)(H * Fs) * sizeof(float));
		g.dws_up = malloc((size_t)(H * Fs) * sizeof(float));
		g.dws_down = malloc((size_t)(Fs * H) * sizeof(float));
	}
	rmoe_ref_backward(&c->layer, T, c->x, c->probs, c->topk_idx, c->topk_w, c->dy, &g);

	check_gradient("dx", c, c->x, T * H, g.dx, idx);
	check_gradient("dw_router", c, c->w_router, H * E, g.dw_router, idx);
	check_gradient("dw_gate", c, c->w_gate, E * H * F, g.dw_gate, idx);
	check_gradient("dw_up", c, c->w_up, E * H * F, g.dw_up, idx);
	check_gradient("dw_down", c, c->w_down, E * F * H, g.dw_down, idx);
	if (Fs > 0) {
		check_gradient("dws_gate", c, c->ws_gate, H * Fs, g.dws_gate, idx);
		check_gradient("dws_up", c, c->ws_up, H * Fs, g.dws_up, idx);
		check_gradient("dws_down", c, c->ws_down, Fs * H, g.dws_down, idx);
	}
	free(g.dx);
	free(g.dw_router);
	free(g.dw_gate);
	free(g.dw_up);
	free(g.dw_down);
	free(g.dws_gate);
	free(g.dws_up);
	free(g.dws_down);
	free(idx);
	case_free(c);
}

static void test_reference_gradients_normalised_with_shared(void **state)
{
	(void)state;
	check_gradients(5, 6, 4, 5, 2, 1, 3);
	/* rows longer than the reference's 8-wide and 4-row blocks, with tails */
	check_gradients(3, 13, 10, 4, 2, 1, 9);
}

static void test_reference_gradients_unnormalised_with_shared(void **state)
{
	(void)state;
	check_gradients(5, 6, 4, 5, 2, 0, 3);
}

static void test_reference_gradients_all_experts(void **state)
{
	(void)state;
	check_gradients(4, 5, 3, 4, 4, 1, 0);
	check_gradients(4, 5, 3, 4, 4, 0, 0);
}

static void test_reference_gradients_top1(void **state)
{
	(void)state;
	check_gradients(5, 6, 4, 5, 1, 0, 2);
	check_gradients(5, 6, 4, 5, 1, 1, 0);
}

/* K = 1 with renormalisation: g = p / p = 1 whatever the router says, so the
 * router gets no gradient at all, exactly. */
static void test_reference_top1_normalised_router_has_no_gradient(void **state)
{
	(void)state;
	const int64_t T = 5, H = 6, F = 4, E = 5;
	struct moe_case *c = case_new(T, H, F, E, 1, 1, 0);
	case_run(c);
	for (int64_t t = 0; t < T; t++)
		assert_true(c->topk_w[t] == 1.0f);
	float dx[5 * 6], dw_router[6 * 5], dw_gate[5 * 6 * 4], dw_up[5 * 6 * 4], dw_down[5 * 4 * 6];
	struct rmoe_ref_grads g = { dx, dw_router, dw_gate, dw_up, dw_down, NULL, NULL, NULL, NULL };
	rmoe_ref_backward(&c->layer, T, c->x, c->probs, c->topk_idx, c->topk_w, c->dy, &g);
	for (int64_t i = 0; i < H * E; i++)
		assert_true(dw_router[i] == 0.0f);
	case_free(c);
}

/* ---- routing: ties and hints -------------------------------------------- */

/* A router over H = 3 inputs whose logits are set by column: experts with
 * identical columns tie exactly, whatever x is. Inputs are positive, so a
 * column raised by d raises the logit by d * sum(x). */
struct router_case {
	struct rmoe_ref_layer layer;
	float x[2 * 3];
	float w_router[3 * 5];
	float probs[2 * 5], topk_w[2 * 5];
	int32_t topk_idx[2 * 5];
};

static void router_case_init(struct router_case *rc, int64_t topk, const float *column_level)
{
	const int64_t H = 3, E = 5;
	float noise[3];
	rmoe_seeded_uniform(rc->x, 2 * H, SEED, RMOE_STREAM_USER, 0, 1.0f);
	for (int64_t i = 0; i < 2 * H; i++)
		rc->x[i] = 0.25f + fabsf(rc->x[i]);
	rmoe_seeded_uniform(noise, H, SEED, RMOE_STREAM_USER + 1, 0, 0.05f);
	for (int64_t h = 0; h < H; h++)
		for (int64_t e = 0; e < E; e++)
			rc->w_router[h * E + e] = column_level[e] + noise[h];
	rc->layer = (struct rmoe_ref_layer){ .hidden = H, .experts = E, .topk = topk,
	                                     .norm_topk = 1, .w_router = rc->w_router };
}

static int64_t router_case_route(struct router_case *rc, int64_t tokens, const int32_t *hint,
                                 double tie_tol)
{
	return rmoe_ref_route(&rc->layer, tokens, rc->x, rc->probs, rc->topk_idx, rc->topk_w, hint,
	                      tie_tol);
}

static void test_reference_route_ties_take_lower_expert_first(void **state)
{
	(void)state;
	struct router_case rc;
	/* 1 and 3 tie at the top, 2 and 4 tie below them */
	const float level[5] = { 0.1f, 1.0f, 0.5f, 1.0f, 0.5f };
	router_case_init(&rc, 1, level);
	assert_int_equal(router_case_route(&rc, 2, NULL, 0.0), 0);
	assert_true(rc.probs[1] == rc.probs[3]);
	assert_int_equal(rc.topk_idx[0], 1);
	assert_int_equal(rc.topk_idx[1], 1);

	router_case_init(&rc, 3, level);
	router_case_route(&rc, 1, NULL, 0.0);
	assert_int_equal(rc.topk_idx[0], 1);
	assert_int_equal(rc.topk_idx[1], 3);
	assert_int_equal(rc.topk_idx[2], 2);
	assert_true(rc.topk_w[0] == rc.topk_w[1]);
}

/* 4 is above 2 by a float32-sized margin; 0 is far above both. */
static const float near_tie_level[5] = { 1.0f, 0.1f, 0.5f, 0.2f, 0.5f + 1e-6f };

static void test_reference_route_hint_near_tie_is_taken(void **state)
{
	(void)state;
	struct router_case rc;
	router_case_init(&rc, 2, near_tie_level);
	assert_int_equal(router_case_route(&rc, 1, NULL, 0.0), 0);
	assert_int_equal(rc.topk_idx[0], 0);
	assert_int_equal(rc.topk_idx[1], 4);

	/* Either order in the hint: the routing is listed by probability. */
	const int32_t hints[2][4] = { { 0, 2, 2, 0 }, { 2, 0, 0, 2 } };
	for (int i = 0; i < 2; i++) {
		assert_int_equal(router_case_route(&rc, 2, hints[i], 1e-5), 2);
		for (int64_t t = 0; t < 2; t++) {
			assert_int_equal(rc.topk_idx[t * 2], 0);
			assert_int_equal(rc.topk_idx[t * 2 + 1], 2);
			const double p0 = rc.probs[t * 5], p2 = rc.probs[t * 5 + 2];
			assert_true(fabs(rc.topk_w[t * 2] - p0 / (p0 + p2)) <= 1e-6);
			assert_true(fabs(rc.topk_w[t * 2 + 1] - p2 / (p0 + p2)) <= 1e-6);
		}
	}
	/* The same set as the reference is no alternative and is not counted. */
	const int32_t same[4] = { 4, 0, 0, 4 };
	assert_int_equal(router_case_route(&rc, 2, same, 1e-5), 0);
	assert_int_equal(rc.topk_idx[1], 4);
	/* A tolerance below the gap turns the same hint into a wrong one. */
	assert_int_equal(router_case_route(&rc, 2, hints[0], 1e-12), -1);
	assert_int_equal(rc.topk_idx[1], 4);
}

static void test_reference_route_wrong_hint_is_refused(void **state)
{
	(void)state;
	struct router_case rc;
	router_case_init(&rc, 2, near_tie_level);
	const int32_t wrong[][4] = {
		{ 0, 2, 0, 1 },   /* token 1 brings in 1, far below the 2nd */
		{ 0, 2, 2, 4 },   /* token 1 drops 0, far above the 2nd */
		{ 0, 2, 0, 5 },   /* no expert 5 */
		{ 0, 2, 0, -1 },  /* no expert -1 */
		{ 0, 2, 0, 0 },   /* the same expert twice */
	};
	for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
		assert_int_equal(router_case_route(&rc, 2, wrong[i], 1e-5), -1);
		/* token 0's acceptable hint is not kept either */
		for (int64_t t = 0; t < 2; t++) {
			assert_int_equal(rc.topk_idx[t * 2], 0);
			assert_int_equal(rc.topk_idx[t * 2 + 1], 4);
		}
	}
}

static void test_reference_rel_err(void **state)
{
	(void)state;
	const float a[3] = { 1.0f, 2.0f, 2.0f }, b[3] = { 1.0f, 2.0f, 3.0f }, zero[3] = { 0 };
	assert_true(rmoe_ref_rel_err(b, b, 3) == 0.0);
	assert_true(fabs(rmoe_ref_rel_err(a, b, 3) - 1.0 / sqrt(14.0)) <= 1e-15);
	assert_true(rmoe_ref_rel_err(zero, zero, 3) == 0.0);
	assert_true(rmoe_ref_rel_err(a, zero, 3) > 1e300);
	const float nan[3] = { 1.0f, NAN, 2.0f };
	assert_true(isnan(rmoe_ref_rel_err(nan, b, 3)));
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_reference_forward_matches_definition),
               cmocka_unit_test(test_reference_all_experts_selected),
               cmocka_unit_test(test_reference_gradients_normalised_with_shared),
               cmocka_unit_test(test_reference_gradients_unnormalised_with_shared),
               cmocka_unit_test(test_reference_gradients_all_experts),
               cmocka_unit_test(test_reference_gradients_top1),
               cmocka_unit_test(test_reference_top1_normalised_router_has_no_gradient),
               cmocka_unit_test(test_reference_route_ties_take_lower_expert_first),
               cmocka_unit_test(test_reference_route_hint_near_tie_is_taken),
               cmocka_unit_test(test_reference_route_wrong_hint_is_refused),
               cmocka_unit_test(test_reference_rel_err))
