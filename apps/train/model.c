/* The MoE language model of `relaymoe train`: embedding, RMSNorm and MoE
 * blocks with residuals, output head, cross-entropy and the load-balancing
 * loss. Dense pieces run here through CBLAS; the MoE blocks are rmoe_layers. */
#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "messages.h"
#include "model.h"
#include "seeded.h"

#define RMS_EPS 1e-6

/* Streams of the parameters; layer -1 holds the embedding and the head. */
enum param_kind { P_EMB, P_HEAD, P_ROUTER, P_GATE, P_UP, P_DOWN, P_SGATE, P_SUP, P_SDOWN };

static uint64_t param_stream(int64_t layer, enum param_kind kind)
{
	return (uint64_t)RMOE_STREAM_USER + 0x1000 + 16 * (uint64_t)(layer + 1) + (uint64_t)kind;
}

static void *zalloc(int64_t n, size_t size)
{
	return calloc((size_t)(n > 0 ? n : 1), size);
}

static void add_tensor(struct rmoe_train_model *m, const char *name, int64_t layer, int64_t offset,
                       int64_t count, int replicated, int decay)
{
	struct rmoe_train_tensor *t = &m->tensors[m->ntensors++];
	if (layer >= 0)
		snprintf(t->name, sizeof(t->name), "layer%lld.%s", (long long)layer, name);
	else
		snprintf(t->name, sizeof(t->name), "%s", name);
	t->offset = offset;
	t->count = count;
	t->replicated = replicated;
	t->decay = decay;
}

/* Lays out both arrays and names every tensor. */
static int layout(struct rmoe_train_model *m)
{
	const struct rmoe_train_shape *s = &m->shape;
	const int64_t L = s->layers, H = s->hidden, E = s->experts, V = s->vocab, Fs = s->shared_ffn;
	m->off_norm = zalloc(L, sizeof(int64_t));
	m->off_router = zalloc(L, sizeof(int64_t));
	m->off_shared = zalloc(L, sizeof(int64_t));
	m->off_experts = zalloc(L, sizeof(int64_t));
	m->tensors = zalloc(4 * L + 4, sizeof(struct rmoe_train_tensor));
	if (!m->off_norm || !m->off_router || !m->off_shared || !m->off_experts || !m->tensors)
		return RMOE_ENOMEM;
	int64_t rep = 0, exp = 0;
	m->off_emb = rep;
	add_tensor(m, "embedding", -1, rep, V * H, 1, 1);
	rep += V * H;
	for (int64_t l = 0; l < L; l++) {
		m->off_norm[l] = rep;
		add_tensor(m, "norm", l, rep, H, 1, 0);
		rep += H;
		m->off_router[l] = rep;
		add_tensor(m, "router", l, rep, H * E, 1, 1);
		rep += H * E;
		m->off_shared[l] = rep;
		if (Fs > 0) {
			add_tensor(m, "shared", l, rep, 3 * H * Fs, 1, 1);
			rep += 3 * H * Fs;
		}
	}
	m->off_norm_f = rep;
	add_tensor(m, "final_norm", -1, rep, H, 1, 0);
	rep += H;
	m->off_head = rep;
	add_tensor(m, "head", -1, rep, H * V, 1, 1);
	rep += H * V;
	const int64_t per_expert = 3 * H * s->ffn;
	for (int64_t l = 0; l < L; l++) {
		m->off_experts[l] = exp;
		add_tensor(m, "experts", l, exp, m->e_local * per_expert, 0, 1);
		exp += m->e_local * per_expert;
	}
	m->rep_n = rep;
	m->exp_n = exp;
	return 0;
}

static void fill(float *dst, int64_t n, float v)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = v;
}

/* Seeded draws; uniform in [-s, s) has standard deviation s / sqrt(3). The
 * down projections are scaled by 1 / sqrt(2L) so the residual stream keeps
 * its scale through L blocks. */
static void draw_parameters(struct rmoe_train_model *m, uint64_t seed)
{
	const struct rmoe_train_shape *s = &m->shape;
	const int64_t L = s->layers, H = s->hidden, F = s->ffn, E = s->experts, V = s->vocab,
	              Fs = s->shared_ffn, HF = H * F;
	const float sh = 1.0f / sqrtf((float)H), depth = 1.0f / sqrtf(2.0f * (float)L);
	rmoe_seeded_uniform(m->rep_w + m->off_emb, V * H, seed, param_stream(-1, P_EMB), 0, 1.0f);
	for (int64_t l = 0; l < L; l++) {
		fill(m->rep_w + m->off_norm[l], H, 1.0f);
		rmoe_seeded_uniform(m->rep_w + m->off_router[l], H * E, seed, param_stream(l, P_ROUTER), 0, sh);
		if (Fs > 0) {
			float *w = m->rep_w + m->off_shared[l];
			rmoe_seeded_uniform(w, H * Fs, seed, param_stream(l, P_SGATE), 0, sh);
			rmoe_seeded_uniform(w + H * Fs, H * Fs, seed, param_stream(l, P_SUP), 0, sh);
			rmoe_seeded_uniform(w + 2 * H * Fs, H * Fs, seed, param_stream(l, P_SDOWN), 0,
			                    depth / sqrtf((float)Fs));
		}
		for (int64_t e = 0; e < m->e_local; e++) {
			int64_t ge = m->first_expert + e;
			float *w = m->exp_w + m->off_experts[l] + e * 3 * HF;
			rmoe_seeded_uniform(w, HF, seed, param_stream(l, P_GATE), ge * HF, sh);
			rmoe_seeded_uniform(w + HF, HF, seed, param_stream(l, P_UP), ge * HF, sh);
			rmoe_seeded_uniform(w + 2 * HF, HF, seed, param_stream(l, P_DOWN), ge * HF,
			                    depth / sqrtf((float)F));
		}
	}
	fill(m->rep_w + m->off_norm_f, H, 1.0f);
	rmoe_seeded_uniform(m->rep_w + m->off_head, H * V, seed, param_stream(-1, P_HEAD), 0, sh);
}

int rmoe_train_model_init(struct rmoe_train_model *m, rmoe_ctx *ctx, const struct rmoe_train_shape *s,
                          enum rmoe_dispatch d, double aux_weight, uint64_t seed)
{
	memset(m, 0, sizeof(*m));
	m->shape = *s;
	m->aux_weight = aux_weight;
	MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &m->nranks);
	m->e_local = s->experts / m->nranks;
	m->first_expert = m->rank * m->e_local;
	const int64_t L = s->layers, T = s->tokens, H = s->hidden, E = s->experts, V = s->vocab,
	              K = s->topk;
	int rc = layout(m);
	if (!rc) {
		m->rep_w = zalloc(m->rep_n, sizeof(float));
		m->rep_g = zalloc(m->rep_n, sizeof(float));
		m->exp_w = zalloc(m->exp_n, sizeof(float));
		m->exp_g = zalloc(m->exp_n, sizeof(float));
		m->h = zalloc((L + 1) * T * H, sizeof(float));
		m->u = zalloc((L + 1) * T * H, sizeof(float));
		m->rinv = zalloc((L + 1) * T, sizeof(double));
		m->logits = zalloc(T * V, sizeof(float));
		m->y = zalloc(T * H, sizeof(float));
		m->dh = zalloc(T * H, sizeof(float));
		m->du = zalloc(T * H, sizeof(float));
		m->probs = zalloc(T * E, sizeof(float));
		m->dprobs = zalloc(T * E, sizeof(float));
		m->topk_idx = zalloc(T * K, sizeof(int32_t));
		m->route = zalloc(L * 2 * E, sizeof(double));
		m->moe = zalloc(L, sizeof(rmoe_layer *));
		if (!m->rep_w || !m->rep_g || !m->exp_w || !m->exp_g || !m->h || !m->u || !m->rinv ||
		    !m->logits || !m->y || !m->dh || !m->du || !m->probs || !m->dprobs || !m->topk_idx ||
		    !m->route || !m->moe)
			rc = RMOE_ENOMEM;
	}
	if (rc)
		rmoe_app_error("out of host memory for the model (%lld replicated and %lld expert parameters)",
		               (long long)m->rep_n, (long long)m->exp_n);
	if ((rc = rmoe_app_agree(rc)))
		return rc;

	struct rmoe_layer_config cfg;
	rmoe_layer_config_init(&cfg);
	cfg.hidden = H;
	cfg.ffn = s->ffn;
	cfg.experts = E;
	cfg.topk = K;
	cfg.tokens = T;
	cfg.shared_ffn = s->shared_ffn;
	cfg.norm_topk = 1;
	cfg.dispatch = d;
	/* Bit-reproducible runs: a resumed run must match an uninterrupted one. */
	cfg.deterministic = 1;
	for (int64_t l = 0; l < L && !rc; l++) {
		rc = rmoe_app_agree(rmoe_layer_create(&m->moe[l], ctx, &cfg));
		if (rc)
			rmoe_app_error("layer %lld: %s", (long long)l, rmoe_strerror(rc));
	}
	if (rc)
		return rc;
	draw_parameters(m, seed);
	return rmoe_train_model_push(m);
}

void rmoe_train_model_free(struct rmoe_train_model *m)
{
	for (int64_t l = 0; m->moe && l < m->shape.layers; l++)
		if (m->moe[l])
			rmoe_layer_destroy(m->moe[l]);
	void *p[] = {m->moe, m->off_norm, m->off_router, m->off_shared, m->off_experts, m->tensors,
	             m->rep_w, m->rep_g, m->exp_w, m->exp_g, m->h, m->u, m->rinv, m->logits, m->y,
	             m->dh, m->du, m->probs, m->dprobs, m->topk_idx, m->route};
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		free(p[i]);
	memset(m, 0, sizeof(*m));
}

int rmoe_train_model_push(struct rmoe_train_model *m)
{
	const int64_t H = m->shape.hidden, HF = H * m->shape.ffn, Fs = m->shape.shared_ffn;
	int rc = 0;
	for (int64_t l = 0; l < m->shape.layers && !rc; l++) {
		rc = rmoe_layer_set_router(m->moe[l], m->rep_w + m->off_router[l]);
		if (!rc && Fs > 0) {
			const float *w = m->rep_w + m->off_shared[l];
			rc = rmoe_layer_set_shared(m->moe[l], w, w + H * Fs, w + 2 * H * Fs);
		}
		for (int64_t e = 0; e < m->e_local && !rc; e++) {
			const float *w = m->exp_w + m->off_experts[l] + e * 3 * HF;
			rc = rmoe_layer_set_expert(m->moe[l], m->first_expert + e, w, w + HF, w + 2 * HF);
		}
	}
	if (rc)
		rmoe_app_error("setting the layers' weights: %s", rmoe_strerror(rc));
	return rmoe_app_agree(rc);
}

/* u = h / rms(h) * g, row by row. */
static void rmsnorm_forward(const float *h, const float *g, int64_t T, int64_t H, float *u, double *rinv)
{
	for (int64_t t = 0; t < T; t++) {
		const float *x = h + t * H;
		double ss = 0.0;
		for (int64_t j = 0; j < H; j++)
			ss += (double)x[j] * x[j];
		double r = 1.0 / sqrt(ss / (double)H + RMS_EPS);
		rinv[t] = r;
		for (int64_t j = 0; j < H; j++)
			u[t * H + j] = (float)(x[j] * r * g[j]);
	}
}

/* From du: dg += sum_t du * h * r; dh += r g du - r^3 h (sum_k g_k du_k h_k) / H. */
static void rmsnorm_backward(const float *h, const float *g, const double *rinv, const float *du,
                             int64_t T, int64_t H, float *dg, float *dh)
{
	double *acc = calloc((size_t)H, sizeof(double));
	for (int64_t t = 0; t < T; t++) {
		const float *x = h + t * H, *d = du + t * H;
		double r = rinv[t], s = 0.0;
		for (int64_t j = 0; j < H; j++) {
			s += (double)g[j] * d[j] * x[j];
			if (acc)
				acc[j] += (double)d[j] * x[j] * r;
		}
		double c = r * r * r * s / (double)H;
		for (int64_t j = 0; j < H; j++)
			dh[t * H + j] += (float)(r * g[j] * d[j] - c * x[j]);
	}
	for (int64_t j = 0; acc && j < H; j++)
		dg[j] += (float)acc[j];
	free(acc);
}

/* Pair counts and probability sums of this rank's tokens for one layer. */
static void route_stats(const struct rmoe_train_model *m, double *out)
{
	const int64_t T = m->shape.tokens, E = m->shape.experts, K = m->shape.topk;
	for (int64_t e = 0; e < 2 * E; e++)
		out[e] = 0.0;
	for (int64_t i = 0; i < T * K; i++)
		out[m->topk_idx[i]] += 1.0;
	for (int64_t t = 0; t < T; t++)
		for (int64_t e = 0; e < E; e++)
			out[E + e] += m->probs[t * E + e];
}

/* Cross-entropy of this rank's tokens (sum, not mean); logits become
 * d(global mean loss)/d(logits). */
static double cross_entropy(struct rmoe_train_model *m, const int32_t *target, double scale)
{
	const int64_t T = m->shape.tokens, V = m->shape.vocab;
	double total = 0.0;
	for (int64_t t = 0; t < T; t++) {
		float *z = m->logits + t * V;
		float top = z[0];
		for (int64_t v = 1; v < V; v++)
			top = z[v] > top ? z[v] : top;
		double sum = 0.0;
		for (int64_t v = 0; v < V; v++)
			sum += exp((double)z[v] - top);
		total += log(sum) + top - z[target[t]];
		for (int64_t v = 0; v < V; v++)
			z[v] = (float)((exp((double)z[v] - top) / sum - (v == target[t])) * scale);
	}
	return total;
}

static int64_t peak_of(const rmoe_layer *layer, int64_t *rss)
{
	struct rmoe_layer_stats st;
	if (rmoe_layer_get_stats(layer, &st))
		return 0;
	*rss = st.peak_rss_bytes;
	return st.peak_forward_bytes > st.peak_backward_bytes ? st.peak_forward_bytes
	                                                      : st.peak_backward_bytes;
}

static int sum_floats(float *buf, int64_t n)
{
	for (int64_t done = 0; done < n;) {
		int chunk = n - done > (1 << 30) ? (1 << 30) : (int)(n - done);
		if (MPI_Allreduce(MPI_IN_PLACE, buf + done, chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) !=
		    MPI_SUCCESS)
			return RMOE_EMPI;
		done += chunk;
	}
	return 0;
}

/* The embedding and the MoE blocks forward, each block's routing counted
 * (route_stats) and its layer's peaks kept in r; 0 or the first RMOE_E*
 * code, agreed over the ranks. */
static int blocks_forward(struct rmoe_train_model *m, const int32_t *seq, struct rmoe_train_result *r)
{
	const struct rmoe_train_shape *s = &m->shape;
	const int64_t L = s->layers, T = s->tokens, H = s->hidden, E = s->experts, TH = T * H;
	const float *w = m->rep_w;
	for (int64_t t = 0; t < T; t++)
		memcpy(m->h + t * H, w + m->off_emb + (int64_t)seq[t] * H, (size_t)H * sizeof(float));
	int rc = 0;
	for (int64_t l = 0; l < L && !rc; l++) {
		float *hl = m->h + l * TH, *ul = m->u + l * TH;
		rmsnorm_forward(hl, w + m->off_norm[l], T, H, ul, m->rinv + l * T);
		rc = rmoe_layer_forward(m->moe[l], ul, m->y);
		if (!rc)
			rc = rmoe_layer_get_routing(m->moe[l], m->topk_idx, NULL, m->probs);
		if (rc)
			rmoe_app_error("layer %lld forward: %s", (long long)l, rmoe_strerror(rc));
		if ((rc = rmoe_app_agree(rc)))
			break;
		for (int64_t i = 0; i < TH; i++)
			hl[TH + i] = hl[i] + m->y[i];
		route_stats(m, m->route + l * 2 * E);
		int64_t peak = peak_of(m->moe[l], &r->peak_rss_bytes);
		r->peak_layer_bytes = peak > r->peak_layer_bytes ? peak : r->peak_layer_bytes;
	}
	return rc;
}

/* The load-balancing loss into r->aux, over all ranks' tokens: f_e and P_e
 * are global. */
static int aux_loss(struct rmoe_train_model *m, struct rmoe_train_result *r)
{
	const int64_t L = m->shape.layers, E = m->shape.experts, K = m->shape.topk;
	const double global_tokens = (double)m->shape.tokens * (double)m->nranks;
	if (MPI_Allreduce(MPI_IN_PLACE, m->route, (int)(L * 2 * E), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) !=
	    MPI_SUCCESS)
		return RMOE_EMPI;
	for (int64_t l = 0; l < L; l++) {
		const double *c = m->route + l * 2 * E;
		double acc = 0.0;
		for (int64_t e = 0; e < E; e++)
			acc += c[e] / (global_tokens * (double)K) * (c[E + e] / global_tokens);
		r->aux += m->aux_weight * (double)E * acc;
	}
	return 0;
}

/* The final RMSNorm, the head and the cross-entropy of the next tokens
 * (r->loss, the mean over all ranks'), then back through them: the head's
 * and the final norm's gradients, and dh, the residual stream's. */
static int output_head(struct rmoe_train_model *m, const int32_t *seq, struct rmoe_train_result *r)
{
	const int64_t L = m->shape.layers, T = m->shape.tokens, H = m->shape.hidden, V = m->shape.vocab, TH = T * H;
	const double global_tokens = (double)T * (double)m->nranks;
	const float *w = m->rep_w;
	float *g = m->rep_g, *hL = m->h + L * TH, *uL = m->u + L * TH;
	rmsnorm_forward(hL, w + m->off_norm_f, T, H, uL, m->rinv + L * T);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)V, (int)H, 1.0f, uL, (int)H,
	            w + m->off_head, (int)V, 0.0f, m->logits, (int)V);
	double loss_sum = cross_entropy(m, seq + 1, 1.0 / global_tokens);
	if (MPI_Allreduce(MPI_IN_PLACE, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
		return RMOE_EMPI;
	r->loss = loss_sum / global_tokens;

	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)V, (int)T, 1.0f, uL, (int)H,
	            m->logits, (int)V, 0.0f, g + m->off_head, (int)V);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)H, (int)V, 1.0f, m->logits,
	            (int)V, w + m->off_head, (int)V, 0.0f, m->du, (int)H);
	memset(m->dh, 0, (size_t)TH * sizeof(float));
	rmsnorm_backward(hL, w + m->off_norm_f, m->rinv + L * T, m->du, T, H, g + m->off_norm_f, m->dh);
	return 0;
}

/* The MoE blocks backward, the last first: each layer's gradients (router,
 * shared expert, this rank's experts) collected, the load-balancing loss's
 * through the probabilities, and dh carried through each block's norm; 0
 * or the first RMOE_E* code, agreed over the ranks. */
static int blocks_backward(struct rmoe_train_model *m, struct rmoe_train_result *r)
{
	const struct rmoe_train_shape *s = &m->shape;
	const int64_t L = s->layers, T = s->tokens, H = s->hidden, E = s->experts, K = s->topk, F = s->ffn,
	              Fs = s->shared_ffn, TH = T * H, HF = H * F;
	const double global_tokens = (double)T * (double)m->nranks;
	const float *w = m->rep_w;
	float *g = m->rep_g;
	int rc = 0;
	for (int64_t l = L - 1; l >= 0 && !rc; l--) {
		const float *dprobs = NULL;
		if (m->aux_weight > 0.0) {
			/* d aux / d p[t][e] = alpha E f_e / (N T), f_e held constant. */
			const double *c = m->route + l * 2 * E;
			for (int64_t e = 0; e < E; e++)
				m->dprobs[e] = (float)(m->aux_weight * (double)E * (c[e] / (global_tokens * (double)K)) /
				                       global_tokens);
			for (int64_t t = 1; t < T; t++)
				memcpy(m->dprobs + t * E, m->dprobs, (size_t)E * sizeof(float));
			dprobs = m->dprobs;
		}
		/* The block's output gradient is the residual stream's: dh. */
		rc = rmoe_layer_backward_ex(m->moe[l], m->dh, dprobs, m->du);
		if (!rc)
			rc = rmoe_layer_get_grad_router(m->moe[l], g + m->off_router[l]);
		if (!rc && Fs > 0) {
			float *gs = g + m->off_shared[l];
			rc = rmoe_layer_get_grad_shared(m->moe[l], gs, gs + H * Fs, gs + 2 * H * Fs);
		}
		for (int64_t e = 0; e < m->e_local && !rc; e++) {
			float *ge = m->exp_g + m->off_experts[l] + e * 3 * HF;
			rc = rmoe_layer_get_grad_expert(m->moe[l], m->first_expert + e, ge, ge + HF, ge + 2 * HF);
		}
		if (rc)
			rmoe_app_error("layer %lld backward: %s", (long long)l, rmoe_strerror(rc));
		if ((rc = rmoe_app_agree(rc)))
			break;
		rmsnorm_backward(m->h + l * TH, w + m->off_norm[l], m->rinv + l * T, m->du, T, H,
		                 g + m->off_norm[l], m->dh);
		int64_t peak = peak_of(m->moe[l], &r->peak_rss_bytes);
		r->peak_layer_bytes = peak > r->peak_layer_bytes ? peak : r->peak_layer_bytes;
	}
	return rc;
}

int rmoe_train_model_step(struct rmoe_train_model *m, const int32_t *seq, struct rmoe_train_result *r)
{
	const int64_t T = m->shape.tokens, H = m->shape.hidden;
	float *g = m->rep_g;
	memset(r, 0, sizeof(*r));
	memset(g, 0, (size_t)m->rep_n * sizeof(float));
	m->seq = seq;
	int rc = blocks_forward(m, seq, r);
	if (!rc)
		rc = aux_loss(m, r);
	if (!rc)
		rc = output_head(m, seq, r);
	if (!rc)
		rc = blocks_backward(m, r);
	if (rc)
		return rc;
	for (int64_t t = 0; t < T; t++) {
		float *d = g + m->off_emb + (int64_t)seq[t] * H;
		for (int64_t j = 0; j < H; j++)
			d[j] += m->dh[t * H + j];
	}
	/* The loss is a global mean already: a plain sum over ranks. */
	rc = sum_floats(g, m->rep_n);
	if (rc)
		rmoe_app_error("MPI_Allreduce of the replicated gradients failed");
	return rmoe_app_agree(rc);
}

int rmoe_train_model_replicas_agree(const struct rmoe_train_model *m)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	const unsigned char *p = (const unsigned char *)m->rep_w;
	for (size_t i = 0; i < (size_t)m->rep_n * sizeof(float); i++)
		h = (h ^ p[i]) * 0x100000001b3ULL;
	uint64_t lo = h, hi = h;
	MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
	MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
	return lo == hi;
}
