/* The reference MoE layer: the definition in relaymoe.h written as plain
 * loops in double precision (float inputs convert exactly; every sum is a
 * double). Pairs are visited expert by expert, so that one expert's weights
 * stay in cache while its tokens stream past, and every product is an i-k-j
 * loop over contiguous rows.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_reference.h"

/* The interface has no error return: a checker that cannot allocate, or is
 * handed a routing that names no expert, has nothing sensible to compare, so
 * it stops loudly. */
static void *xcalloc(int64_t count, size_t size)
{
	void *p = calloc(count > 0 ? (size_t)count : 1, size);
	if (!p) {
		fprintf(stderr, "reference: out of memory (%lld x %zu bytes)\n", (long long)count, size);
		abort();
	}
	return p;
}

static void store_float(float *dst, const double *src, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = (float)src[i];
}

static void load_row(double *dst, const float *src, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = src[i];
}

static double sigmoid(double a)
{
	return 1.0 / (1.0 + exp(-a));
}

/* ---- vector kernels ------------------------------------------------------ */

/* All arithmetic is double; float operands convert exactly. The fixed-width
 * inner loops are there for the compiler: at -O2 GCC vectorizes only loops
 * whose trip count it knows, and the reference must stay fast enough for
 * `relaymoe run --check` on tens of thousands of tokens. */
#define LANES 8

/* y += a * x, for float and for double x */
#define DEFINE_AXPY(name, T)                                                                  \
	static void name(int64_t n, double a, const T *restrict x, double *restrict y)         \
	{                                                                                      \
		int64_t i = 0;                                                                 \
		for (; i + LANES <= n; i += LANES)                                             \
			for (int j = 0; j < LANES; j++)                                        \
				y[i + j] += a * x[i + j];                                      \
		for (; i < n; i++)                                                             \
			y[i] += a * x[i];                                                      \
	}
DEFINE_AXPY(axpy, float)
DEFINE_AXPY(axpy_d, double)

/* y [n] += scale * v [m] M [m, n], i-k-j: four rows of M per pass over y,
 * which quarters the loads and stores of y. */
static void vecmat(int64_t m, int64_t n, double scale, const double *restrict v,
                   const float *restrict M, double *restrict y)
{
	int64_t i = 0;
	for (; i + 4 <= m; i += 4) {
		const double c0 = scale * v[i], c1 = scale * v[i + 1];
		const double c2 = scale * v[i + 2], c3 = scale * v[i + 3];
		const float *r0 = M + i * n, *r1 = r0 + n, *r2 = r1 + n, *r3 = r2 + n;
		int64_t j = 0;
		for (; j + LANES <= n; j += LANES)
			for (int l = 0; l < LANES; l++)
				y[j + l] += c0 * r0[j + l] + c1 * r1[j + l] + c2 * r2[j + l] +
				            c3 * r3[j + l];
		for (; j < n; j++)
			y[j] += c0 * r0[j] + c1 * r1[j] + c2 * r2[j] + c3 * r3[j];
	}
	for (; i < m; i++)
		axpy(n, scale * v[i], M + i * n, y);
}

/* ---- routing ------------------------------------------------------------ */

static void softmax_row(const float *w_router, int64_t hidden, int64_t experts, const double *x,
                        double *p)
{
	for (int64_t e = 0; e < experts; e++)
		p[e] = 0.0;
	vecmat(hidden, experts, 1.0, x, w_router, p);
	double max = p[0];
	for (int64_t e = 1; e < experts; e++)
		if (p[e] > max)
			max = p[e];
	double sum = 0.0;
	for (int64_t e = 0; e < experts; e++) {
		p[e] = exp(p[e] - max);
		sum += p[e];
	}
	for (int64_t e = 0; e < experts; e++)
		p[e] /= sum;
}

/* "a ranks before b": larger probability, ties to the lower expert. */
static int ranks_before(const double *p, int32_t a, int32_t b)
{
	return p[a] > p[b] || (p[a] == p[b] && a < b);
}

static void top_k(const double *p, int64_t experts, int64_t topk, unsigned char *taken, int32_t *idx)
{
	memset(taken, 0, (size_t)experts);
	for (int64_t k = 0; k < topk; k++) {
		int32_t best = -1;
		for (int32_t e = 0; e < experts; e++)
			if (!taken[e] && (best < 0 || ranks_before(p, e, best)))
				best = e;
		taken[best] = 1;
		idx[k] = best;
	}
}

static void sort_by_probability(const double *p, int32_t *idx, int64_t topk)
{
	for (int64_t i = 1; i < topk; i++) {
		int32_t v = idx[i];
		int64_t j = i;
		for (; j > 0 && ranks_before(p, v, idx[j - 1]); j--)
			idx[j] = idx[j - 1];
		idx[j] = v;
	}
}

/* 1: hint is an acceptable near-tie alternative to ref, 0: it is the same set,
 * -1: it is wrong. Besides the experts the hint brings in (no more than tie_tol
 * below the K-th probability), the ones it leaves out must be no more than
 * tie_tol above it: dropping a clear winner is no float32 near-tie. */
static int judge_hint(const double *p, int64_t experts, int64_t topk, const int32_t *ref,
                      const int32_t *hint, double tie_tol, unsigned char *mark)
{
	if (topk <= 0)
		return 0;
	memset(mark, 0, (size_t)experts);
	for (int64_t k = 0; k < topk; k++) {
		if (hint[k] < 0 || hint[k] >= experts || (mark[hint[k]] & 1))
			return -1;
		mark[hint[k]] |= 1;
	}
	for (int64_t k = 0; k < topk; k++)
		mark[ref[k]] |= 2;
	const double p_kth = p[ref[topk - 1]];
	int differs = 0;
	for (int32_t e = 0; e < experts; e++) {
		if (mark[e] == 1) {
			differs = 1;
			if (!(p[e] >= p_kth - tie_tol))
				return -1;
		} else if (mark[e] == 2) {
			if (!(p[e] <= p_kth + tie_tol))
				return -1;
		}
	}
	return differs;
}

int64_t rmoe_ref_route(const struct rmoe_ref_layer *L, int64_t tokens, const float *x,
                       float *probs, int32_t *topk_idx, float *topk_w,
                       const int32_t *hint, double tie_tol)
{
	const int64_t H = L->hidden, E = L->experts, K = L->topk;
	double *p = xcalloc(E, sizeof(*p));
	unsigned char *mark = xcalloc(E, 1);
	double *x_row = xcalloc(H, sizeof(*x_row));
	int64_t taken_hints = 0;
	int wrong = 0;

	for (int64_t t = 0; t < tokens && !wrong; t++) {
		int32_t *idx = topk_idx + t * K;
		load_row(x_row, x + t * H, H);
		softmax_row(L->w_router, H, E, x_row, p);
		top_k(p, E, K, mark, idx);
		if (hint) {
			int verdict = judge_hint(p, E, K, idx, hint + t * K, tie_tol, mark);
			if (verdict < 0) {
				wrong = 1;
				break;
			}
			if (verdict > 0) {
				memcpy(idx, hint + t * K, (size_t)K * sizeof(*idx));
				sort_by_probability(p, idx, K);
				taken_hints++;
			}
		}
		double sum = 0.0;
		for (int64_t k = 0; k < K; k++)
			sum += p[idx[k]];
		for (int64_t k = 0; k < K; k++)
			topk_w[t * K + k] = (float)(L->norm_topk ? p[idx[k]] / sum : p[idx[k]]);
		if (probs)
			store_float(probs + t * E, p, E);
	}
	free(x_row);
	free(mark);
	free(p);
	if (wrong) {
		rmoe_ref_route(L, tokens, x, probs, topk_idx, topk_w, NULL, 0.0);
		return -1;
	}
	return taken_hints;
}

/* ---- one SwiGLU expert --------------------------------------------------- */

/* Backward also needs the transposes, so that every product is an axpy over
 * a contiguous row: a dot product would chain each addition to the last. */
struct swiglu {
	int64_t hidden, ffn;
	const float *gate, *up;  /* [H, F] */
	const float *down;       /* [F, H] */
	float *gate_t, *up_t;    /* [F, H], backward only */
	float *down_t;           /* [H, F], backward only */
};

static void transpose(float *dst, const float *src, int64_t rows, int64_t cols)
{
	for (int64_t i = 0; i < rows; i++)
		for (int64_t j = 0; j < cols; j++)
			dst[j * rows + i] = src[i * cols + j];
}

static void swiglu_transposes(struct swiglu *w, float *scratch)
{
	const int64_t HF = w->hidden * w->ffn;
	w->gate_t = scratch;
	w->up_t = scratch + HF;
	w->down_t = scratch + 2 * HF;
	transpose(w->gate_t, w->gate, w->hidden, w->ffn);
	transpose(w->up_t, w->up, w->hidden, w->ffn);
	transpose(w->down_t, w->down, w->ffn, w->hidden);
}

/* Weight gradients of one expert, accumulated in double; a NULL member is
 * not wanted. */
struct swiglu_grads {
	double *gate, *up, *down;
};

/* Per-pair intermediates, reused from pair to pair. */
struct swiglu_work {
	double *x, *dy;          /* [H] */
	double *a, *u, *act, *r; /* [F]: gate and up pre-activations, silu(a)*u, w_down dy */
};

static void work_init(struct swiglu_work *s, int64_t hidden, int64_t ffn)
{
	s->x = xcalloc(hidden, sizeof(double));
	s->dy = xcalloc(hidden, sizeof(double));
	s->a = xcalloc(ffn, sizeof(double));
	s->u = xcalloc(ffn, sizeof(double));
	s->act = xcalloc(ffn, sizeof(double));
	s->r = xcalloc(ffn, sizeof(double));
}

static void work_free(struct swiglu_work *s)
{
	double *all[] = {s->x, s->dy, s->a, s->u, s->act, s->r};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(all[i]);
}

/* a = x w_gate, u = x w_up, act = silu(a) * u, from s->x. */
static void swiglu_hidden(const struct swiglu *w, struct swiglu_work *s)
{
	const int64_t H = w->hidden, F = w->ffn;
	for (int64_t f = 0; f < F; f++)
		s->a[f] = s->u[f] = 0.0;
	vecmat(H, F, 1.0, s->x, w->gate, s->a);
	vecmat(H, F, 1.0, s->x, w->up, s->u);
	for (int64_t f = 0; f < F; f++)
		s->act[f] = s->a[f] * sigmoid(s->a[f]) * s->u[f];
}

/* out += scale * (act w_down). */
static void swiglu_output(const struct swiglu *w, const struct swiglu_work *s, double scale,
                          double *out)
{
	const int64_t H = w->hidden, F = w->ffn;
	vecmat(F, H, scale, s->act, w->down, out);
}

/* Gradients of scale * expert(x) against s->dy: weight gradients added into
 * dw, d/dx added into dx. Returns <dy, expert(x)>, the derivative with
 * respect to scale. */
static double swiglu_backward(const struct swiglu *w, struct swiglu_work *s, double scale,
                              const struct swiglu_grads *dw, double *dx)
{
	const int64_t H = w->hidden, F = w->ffn;
	swiglu_hidden(w, s);
	for (int64_t f = 0; f < F; f++)
		s->r[f] = 0.0;
	vecmat(H, F, 1.0, s->dy, w->down_t, s->r);
	double dscale = 0.0;
	for (int64_t f = 0; f < F; f++)
		dscale += s->act[f] * s->r[f];
	if (dw->down)
		for (int64_t f = 0; f < F; f++)
			axpy_d(H, scale * s->act[f], s->dy, dw->down + f * H);
	/* r becomes d/da, a becomes d/du; silu'(a) = sig(a) (1 + a (1 - sig(a))). */
	for (int64_t f = 0; f < F; f++) {
		const double a = s->a[f], sig = sigmoid(a), dact = scale * s->r[f];
		s->r[f] = dact * s->u[f] * sig * (1.0 + a * (1.0 - sig));
		s->a[f] = dact * a * sig;
	}
	const double *da = s->r, *du = s->a;
	for (int64_t h = 0; h < H; h++) {
		if (dw->gate)
			axpy_d(F, s->x[h], da, dw->gate + h * F);
		if (dw->up)
			axpy_d(F, s->x[h], du, dw->up + h * F);
	}
	vecmat(F, H, 1.0, da, w->gate_t, dx);
	vecmat(F, H, 1.0, du, w->up_t, dx);
	return dscale;
}

/* Pairs p = t*K + k ordered by expert, ascending p within one expert:
 * pairs of expert e are order[first[e] .. first[e+1]). */
static void pairs_by_expert(const int32_t *topk_idx, int64_t pairs, int64_t experts,
                            int64_t **order, int64_t **first)
{
	*first = xcalloc(experts + 1, sizeof(int64_t));
	*order = xcalloc(pairs, sizeof(int64_t));
	for (int64_t p = 0; p < pairs; p++) {
		if (topk_idx[p] < 0 || topk_idx[p] >= experts) {
			fprintf(stderr, "reference: pair %lld routed to expert %d, outside [0, %lld)\n",
			        (long long)p, topk_idx[p], (long long)experts);
			abort();
		}
		(*first)[topk_idx[p] + 1]++;
	}
	for (int64_t e = 0; e < experts; e++)
		(*first)[e + 1] += (*first)[e];
	int64_t *next = xcalloc(experts, sizeof(int64_t));
	memcpy(next, *first, (size_t)experts * sizeof(int64_t));
	for (int64_t p = 0; p < pairs; p++)
		(*order)[next[topk_idx[p]]++] = p;
	free(next);
}

/* ---- forward ------------------------------------------------------------ */

static struct swiglu routed_expert(const struct rmoe_ref_layer *L, int64_t e)
{
	const int64_t HF = L->hidden * L->ffn;
	return (struct swiglu){ L->hidden, L->ffn, L->w_gate + e * HF, L->w_up + e * HF,
	                        L->w_down + e * HF, NULL, NULL, NULL };
}

/* The shared expert's scale for the token row x: 1 (DeepSeek-style), or
 * Qwen2-MoE's sigmoid(x . w_shared_expert_gate). */
static double shared_gate(const struct rmoe_ref_layer *L, const double *x)
{
	if (!L->shared_gated)
		return 1.0;
	double z = 0.0;
	for (int64_t h = 0; h < L->hidden; h++)
		z += x[h] * L->w_shared_expert_gate[h];
	return sigmoid(z);
}

void rmoe_ref_forward(const struct rmoe_ref_layer *L, int64_t tokens, const float *x,
                      const int32_t *topk_idx, const float *topk_w, float *y)
{
	const int64_t H = L->hidden, F = L->ffn, E = L->experts, K = L->topk, Fs = L->shared_ffn;
	double *acc = xcalloc(tokens * H, sizeof(double));
	int64_t *order, *first;
	pairs_by_expert(topk_idx, tokens * K, E, &order, &first);

	struct swiglu_work s;
	work_init(&s, H, F > Fs ? F : Fs);
	for (int64_t e = 0; e < E; e++) {
		const struct swiglu w = routed_expert(L, e);
		for (int64_t i = first[e]; i < first[e + 1]; i++) {
			const int64_t p = order[i], t = p / K;
			load_row(s.x, x + t * H, H);
			swiglu_hidden(&w, &s);
			swiglu_output(&w, &s, topk_w[p], acc + t * H);
		}
	}
	if (Fs > 0) {
		const struct swiglu w = { H, Fs, L->ws_gate, L->ws_up, L->ws_down, NULL, NULL, NULL };
		for (int64_t t = 0; t < tokens; t++) {
			load_row(s.x, x + t * H, H);
			swiglu_hidden(&w, &s);
			swiglu_output(&w, &s, shared_gate(L, s.x), acc + t * H);
		}
	}
	store_float(y, acc, tokens * H);
	work_free(&s);
	free(order);
	free(first);
	free(acc);
}

/* ---- backward ----------------------------------------------------------- */

static struct swiglu_grads grads_alloc(int64_t n, int want_gate, int want_up, int want_down)
{
	return (struct swiglu_grads){ want_gate ? xcalloc(n, sizeof(double)) : NULL,
	                              want_up ? xcalloc(n, sizeof(double)) : NULL,
	                              want_down ? xcalloc(n, sizeof(double)) : NULL };
}

static void grads_store(struct swiglu_grads *dw, int64_t n, float *gate, float *up, float *down)
{
	if (gate)
		store_float(gate, dw->gate, n);
	if (up)
		store_float(up, dw->up, n);
	if (down)
		store_float(down, dw->down, n);
	free(dw->gate);
	free(dw->up);
	free(dw->down);
}

/* dlogits = p * (dp - <p, dp>), where dp is nonzero only on the selected
 * experts, and reaches them through the renormalisation g_k = p_k / S when
 * it is on: dp_k = (dg_k - sum_j dg_j g_j) / S. */
static void router_backward(const struct rmoe_ref_layer *L, const float *x, const float *probs,
                            const int32_t *idx, const float *g, const double *dg,
                            const float *w_router_t, double *dw_router, double *dlogits,
                            double *dp, double *dx)
{
	const int64_t H = L->hidden, E = L->experts, K = L->topk;
	if (L->norm_topk) {
		double sum_p = 0.0, sum_dg_g = 0.0;
		for (int64_t k = 0; k < K; k++) {
			sum_p += probs[idx[k]];
			sum_dg_g += dg[k] * g[k];
		}
		for (int64_t k = 0; k < K; k++)
			dp[k] = (dg[k] - sum_dg_g) / sum_p;
	} else {
		for (int64_t k = 0; k < K; k++)
			dp[k] = dg[k];
	}
	double p_dot_dp = 0.0;
	for (int64_t k = 0; k < K; k++)
		p_dot_dp += probs[idx[k]] * dp[k];
	for (int64_t e = 0; e < E; e++)
		dlogits[e] = -probs[e] * p_dot_dp;
	for (int64_t k = 0; k < K; k++)
		dlogits[idx[k]] += probs[idx[k]] * dp[k];

	for (int64_t h = 0; h < H; h++)
		axpy_d(E, x[h], dlogits, dw_router + h * E);
	vecmat(E, H, 1.0, dlogits, w_router_t, dx);
}

void rmoe_ref_backward(const struct rmoe_ref_layer *L, int64_t tokens, const float *x,
                       const float *probs, const int32_t *topk_idx, const float *topk_w,
                       const float *dy, struct rmoe_ref_grads *g)
{
	const int64_t H = L->hidden, F = L->ffn, E = L->experts, K = L->topk, Fs = L->shared_ffn;
	double *dx = xcalloc(tokens * H, sizeof(double));
	double *dg = xcalloc(tokens * K, sizeof(double));
	int64_t *order, *first;
	pairs_by_expert(topk_idx, tokens * K, E, &order, &first);

	struct swiglu_work s;
	work_init(&s, H, F > Fs ? F : Fs);
	float *scratch = xcalloc(3 * H * (F > Fs ? F : Fs), sizeof(float));
	for (int64_t e = 0; e < E; e++) {
		struct swiglu w = routed_expert(L, e);
		swiglu_transposes(&w, scratch);
		struct swiglu_grads dw = grads_alloc(H * F, 1, 1, 1);
		for (int64_t i = first[e]; i < first[e + 1]; i++) {
			const int64_t p = order[i], t = p / K;
			load_row(s.x, x + t * H, H);
			load_row(s.dy, dy + t * H, H);
			dg[p] = swiglu_backward(&w, &s, topk_w[p], &dw, dx + t * H);
		}
		grads_store(&dw, H * F, g->dw_gate + e * H * F, g->dw_up + e * H * F,
		            g->dw_down + e * F * H);
	}
	if (Fs > 0) {
		struct swiglu w = { H, Fs, L->ws_gate, L->ws_up, L->ws_down, NULL, NULL, NULL };
		swiglu_transposes(&w, scratch);
		struct swiglu_grads dw = grads_alloc(H * Fs, g->dws_gate != NULL, g->dws_up != NULL,
		                                     g->dws_down != NULL);
		double *dwsg = L->shared_gated ? xcalloc(H, sizeof(double)) : NULL;
		for (int64_t t = 0; t < tokens; t++) {
			load_row(s.x, x + t * H, H);
			load_row(s.dy, dy + t * H, H);
			/* d/dscale of scale * shared(x) is <dy, shared(x)>; through the
			 * sigmoid, dz = that g (1 - g); z = x . w. */
			const double gate = shared_gate(L, s.x);
			const double dscale = swiglu_backward(&w, &s, gate, &dw, dx + t * H);
			if (dwsg) {
				const double dz = dscale * gate * (1.0 - gate);
				axpy_d(H, dz, s.x, dwsg);
				for (int64_t h = 0; h < H; h++)
					dx[t * H + h] += dz * L->w_shared_expert_gate[h];
			}
		}
		grads_store(&dw, H * Fs, g->dws_gate, g->dws_up, g->dws_down);
		if (dwsg && g->dw_shared_expert_gate)
			store_float(g->dw_shared_expert_gate, dwsg, H);
		free(dwsg);
	}

	free(scratch);

	float *w_router_t = xcalloc(E * H, sizeof(float));
	transpose(w_router_t, L->w_router, H, E);
	double *dw_router = xcalloc(H * E, sizeof(double));
	double *dlogits = xcalloc(E, sizeof(double));
	double *dp = xcalloc(K, sizeof(double));
	for (int64_t t = 0; t < tokens; t++)
		router_backward(L, x + t * H, probs + t * E, topk_idx + t * K, topk_w + t * K,
		                dg + t * K, w_router_t, dw_router, dlogits, dp, dx + t * H);
	store_float(g->dw_router, dw_router, H * E);
	store_float(g->dx, dx, tokens * H);

	free(dp);
	free(dlogits);
	free(dw_router);
	free(w_router_t);
	work_free(&s);
	free(order);
	free(first);
	free(dg);
	free(dx);
}

double rmoe_ref_rel_err(const float *a, const float *b, int64_t n)
{
	double diff = 0.0, norm = 0.0;
	for (int64_t i = 0; i < n; i++) {
		const double d = (double)a[i] - (double)b[i];
		diff += d * d;
		norm += (double)b[i] * b[i];
	}
	return sqrt(diff) / fmax(sqrt(norm), DBL_MIN);
}
