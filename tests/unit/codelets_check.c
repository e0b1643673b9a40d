/* The helpers of codelets_check.h: seeded inputs, vector handles, relative
 * errors, the routing and the expert in double precision, and the group
 * set-up. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "cmocka_main.h"
#include "codelets_check.h"
#include "codelets_fixture.h"
#include "rmoe_hash.h"

/* ---- seeded inputs ------------------------------------------------------ */

static uint64_t rng_next(struct rng *r)
{
	uint64_t x = r->state;
	r->state += RMOE_GOLDEN_GAMMA;
	return rmoe_splitmix64(x);
}

double rng_unit(struct rng *r)
{
	return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

int64_t rng_below(struct rng *r, int64_t n)
{
	return (int64_t)(rng_unit(r) * (double)n);
}

/* Uniform in [-scale, scale), away from zero. */
static void rng_fill(struct rng *r, float *v, int64_t n, double scale)
{
	for (int64_t i = 0; i < n; i++) {
		double u = 2.0 * rng_unit(r) - 1.0;
		v[i] = (float)(scale * (u >= 0.0 ? 0.05 + 0.95 * u : -0.05 + 0.95 * u));
	}
}

float *rng_floats(struct rng *r, int64_t n, double scale)
{
	float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
	assert_non_null(v);
	rng_fill(r, v, n, scale);
	return v;
}

void *xcalloc(int64_t n, size_t size)
{
	void *p = calloc((size_t)(n > 0 ? n : 1), size);
	assert_non_null(p);
	return p;
}

const struct rmoe_task_opts *opts(const char *name)
{
	static struct rmoe_task_opts o;
	o = (struct rmoe_task_opts){.name = name};
	return &o;
}

/* ---- StarPU helpers ----------------------------------------------------- */

starpu_data_handle_t vec_f(float *ptr, int64_t n)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptr, (uint32_t)n, sizeof(float));
	return h;
}

starpu_data_handle_t vec_i(int32_t *ptr, int64_t n)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptr, (uint32_t)n, sizeof(int32_t));
	return h;
}

starpu_data_handle_t vec_tmp(int64_t n)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, -1, 0, (uint32_t)n, sizeof(float));
	return h;
}

void unregister_all(starpu_data_handle_t *h, int n)
{
	for (int i = 0; i < n; i++)
		starpu_data_unregister(h[i]);
}

void wait_all(void)
{
	assert_int_equal(starpu_task_wait_for_all(), 0);
}

/* ---- comparisons -------------------------------------------------------- */

double rel_err_d(const float *a, const double *ref, int64_t n)
{
	double num = 0.0, den = 0.0;
	for (int64_t i = 0; i < n; i++) {
		num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return sqrt(num) / fmax(sqrt(den), 1e-300);
}

double rel_err_f(const float *a, const float *b, int64_t n)
{
	double num = 0.0, den = 0.0;
	for (int64_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return sqrt(num) / fmax(sqrt(den), 1e-300);
}

/* ---- reference routing, in double ------------------------------------- */

void ref_softmax(const float *x, const float *w_router, int64_t H, int64_t E, double *p)
{
	double max = -INFINITY, sum = 0.0;
	for (int64_t e = 0; e < E; e++) {
		double l = 0.0;
		for (int64_t h = 0; h < H; h++)
			l += (double)x[h] * w_router[h * E + e];
		p[e] = l;
		max = fmax(max, l);
	}
	for (int64_t e = 0; e < E; e++) {
		p[e] = exp(p[e] - max);
		sum += p[e];
	}
	for (int64_t e = 0; e < E; e++)
		p[e] /= sum;
}

/* K largest, descending, ties to the lower expert. */
static void ref_topk(const double *p, int64_t E, int64_t K, int32_t *idx)
{
	for (int64_t k = 0; k < K; k++) {
		int64_t best = -1;
		for (int64_t e = 0; e < E; e++) {
			int taken = 0;
			for (int64_t j = 0; j < k; j++)
				taken |= idx[j] == e;
			if (!taken && (best < 0 || p[e] > p[best]))
				best = e;
		}
		idx[k] = (int32_t)best;
	}
}

void ref_topk_weights(const double *p, const int32_t *idx, int64_t K, int norm, double *w)
{
	double s = 0.0;
	for (int64_t k = 0; k < K; k++)
		s += p[idx[k]];
	for (int64_t k = 0; k < K; k++)
		w[k] = norm ? p[idx[k]] / s : p[idx[k]];
}

void ref_route(const float *x, const float *w_router, int64_t T, int64_t H, int64_t E, int64_t K,
               int norm, double *probs, int32_t *idx, double *tw)
{
	for (int64_t t = 0; t < T; t++) {
		ref_softmax(x + t * H, w_router, H, E, probs + t * E);
		ref_topk(probs + t * E, E, K, idx + t * K);
		ref_topk_weights(probs + t * E, idx + t * K, K, norm, tw + t * K);
	}
}

void random_routing(struct rng *r, int64_t T, int64_t K, int64_t E, const int *allowed, int skew,
                    int32_t *idx)
{
	int32_t *list = xcalloc(E, sizeof(int32_t));
	int64_t n = 0;
	for (int64_t e = 0; e < E; e++)
		if (!allowed || allowed[e])
			list[n++] = (int32_t)e;
	assert_true(n >= K);
	for (int64_t t = 0; t < T; t++) {
		for (int64_t k = 0; k < K;) {
			double u = rng_unit(r);
			int32_t e = list[(int64_t)(n * (skew ? u * u * u : u))];
			int taken = 0;
			for (int64_t j = 0; j < k; j++)
				taken |= idx[t * K + j] == e;
			if (!taken)
				idx[t * K + k++] = e;
		}
	}
	free(list);
}

void ref_dispatch(const int32_t *idx, int64_t T, int64_t K, int64_t E, int32_t *pair_order, int32_t *counts)
{
	int64_t n = 0;
	for (int64_t e = 0; e < E; e++) {
		counts[e] = 0;
		for (int64_t p = 0; p < T * K; p++)
			if (idx[p] == e) {
				pair_order[n++] = (int32_t)p;
				counts[e]++;
			}
	}
}

/* ---- reference expert, in double -------------------------------------- */

struct ref_expert ref_expert_of(const float *partition, int64_t ne, int64_t H, int64_t F, int64_t e)
{
	struct ref_expert x = {
		.gate = partition + e * H * F,
		.up = partition + (ne + e) * H * F,
		.down = partition + (2 * ne + e) * H * F,
		.H = H,
		.F = F,
	};
	return x;
}

double ref_sigmoid(double g)
{
	return 1.0 / (1.0 + exp(-g));
}

void ref_expert_fwd(const struct ref_expert *x, const float *row, double *gate, double *up,
                    double *act, double *out)
{
	const int64_t H = x->H, F = x->F;
	for (int64_t j = 0; j < F; j++) {
		double g = 0.0, u = 0.0;
		for (int64_t h = 0; h < H; h++) {
			g += (double)row[h] * x->gate[h * F + j];
			u += (double)row[h] * x->up[h * F + j];
		}
		gate[j] = g;
		up[j] = u;
		act[j] = g * ref_sigmoid(g) * u;
	}
	if (out)
		for (int64_t h = 0; h < H; h++) {
			double o = 0.0;
			for (int64_t j = 0; j < F; j++)
				o += act[j] * x->down[j * H + h];
			out[h] = o;
		}
}

struct rmoe_expert_shape expert_shape(int64_t H, int64_t F, int64_t ne, const int64_t *rows_per_expert)
{
	struct rmoe_expert_shape a = {.hidden = H, .ffn = F, .n_experts = ne, .rows_per_expert = rows_per_expert};
	for (int64_t e = 0; e < ne; e++)
		a.rows += rows_per_expert[e];
	return a;
}

/* ---- slices of a routing ------------------------------------------------ */

void slice_case_init(struct slice_case *c, struct rng *r, int64_t T, int64_t K, int64_t E, int64_t H,
                     int64_t e0, int64_t e1, const int *allowed, int skew)
{
	c->T = T;
	c->K = K;
	c->E = E;
	c->H = H;
	c->idx = xcalloc(T * K, sizeof(int32_t));
	c->pair_order = xcalloc(T * K, sizeof(int32_t));
	c->counts = xcalloc(E, sizeof(int32_t));
	c->topk_w = rng_floats(r, T * K, 1.0);
	random_routing(r, T, K, E, allowed, skew, c->idx);
	ref_dispatch(c->idx, T, K, E, c->pair_order, c->counts);
	c->first = c->count = 0;
	for (int64_t e = 0; e < e1; e++) {
		if (e < e0)
			c->first += c->counts[e];
		else
			c->count += c->counts[e];
	}
}

void slice_case_free(struct slice_case *c)
{
	free(c->idx);
	free(c->pair_order);
	free(c->counts);
	free(c->topk_w);
}

/* ---- group set-up ------------------------------------------------------- */

int on_cuda;

int codelets_group_setup(void **state)
{
	(void)state;
	const char *dev = getenv("RMOE_TEST_DEVICE");
	on_cuda = dev && strcmp(dev, "cuda") == 0;
	int ret = codelets_fixture_start(on_cuda);
	if (ret == -ENODEV && on_cuda) {
		fprintf(stderr, "codelet tests: RMOE_TEST_DEVICE=cuda but StarPU found no CUDA worker: skipped\n");
		exit(77);
	}
	if (ret != 0) {
		fprintf(stderr, "starpu_init: %d\n", ret);
		return -1;
	}
	return 0;
}
