/* Multi-rank: the gradients of the training model (apps/train/model.c)
 * against central finite differences of its objective J = cross-entropy +
 * load-balancing loss, one parameter group at a time (embedding, block
 * norms, routers, shared experts, final norm, head, routed experts), for the
 * ring and the all-to-all dispatcher. Along the direction d = grad_S of group
 * S, dJ/de at 0 is |grad_S|^2 exactly; the central difference with a step of
 * norm STEP has O(STEP^2) truncation error, and fp32 evaluation noise of J
 * (about 1e-7 relative) divided by STEP. The step is small enough that no
 * token's top-k choice changes (the routing is not differentiated: a
 * step of 2e-2 along the router gradient flips some and is 17% off). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "harness.h"
#include "messages.h"
#include "model.h"

#define STEP 3e-3
/* Truncation (STEP^2 times the curvature) and evaluation noise (1e-7 * J /
 * STEP / |grad_S|) stay below 1e-4 for these sizes (measured: 6e-5 at most);
 * a missing or wrong gradient term is off by far more. */
#define TOLERANCE 1e-3

static int failures;

static double objective(struct rmoe_train_model *m, const int32_t *seq)
{
	struct rmoe_train_result r;
	if (rmoe_train_model_push(m) || rmoe_train_model_step(m, seq, &r))
		return NAN;
	return r.loss + r.aux;
}

/* Tensors of m whose name ends with suffix. */
static int in_group(const struct rmoe_train_tensor *t, const char *suffix)
{
	size_t n = strlen(t->name), k = strlen(suffix);
	return n >= k && strcmp(t->name + n - k, suffix) == 0;
}

static void check_group(struct rmoe_train_model *m, const int32_t *seq, const char *group,
                        const float *g_rep, const float *g_exp)
{
	float *w_rep = malloc((size_t)m->rep_n * sizeof(float));
	float *w_exp = malloc((size_t)(m->exp_n > 0 ? m->exp_n : 1) * sizeof(float));
	memcpy(w_rep, m->rep_w, (size_t)m->rep_n * sizeof(float));
	memcpy(w_exp, m->exp_w, (size_t)m->exp_n * sizeof(float));
	double rep_sq = 0.0, exp_sq = 0.0;
	for (int i = 0; i < m->ntensors; i++) {
		const struct rmoe_train_tensor *t = &m->tensors[i];
		if (!in_group(t, group))
			continue;
		const float *g = (t->replicated ? g_rep : g_exp) + t->offset;
		for (int64_t k = 0; k < t->count; k++)
			*(t->replicated ? &rep_sq : &exp_sq) += (double)g[k] * g[k];
	}
	MPI_Allreduce(MPI_IN_PLACE, &exp_sq, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	const double norm_sq = rep_sq + exp_sq, eps = STEP / sqrt(norm_sq);
	double j[2];
	for (int side = 0; side < 2; side++) {
		const double e = side ? -eps : eps;
		for (int i = 0; i < m->ntensors; i++) {
			const struct rmoe_train_tensor *t = &m->tensors[i];
			if (!in_group(t, group))
				continue;
			float *w = (t->replicated ? m->rep_w : m->exp_w) + t->offset;
			const float *w0 = (t->replicated ? w_rep : w_exp) + t->offset;
			const float *g = (t->replicated ? g_rep : g_exp) + t->offset;
			for (int64_t k = 0; k < t->count; k++)
				w[k] = (float)(w0[k] + e * g[k]);
		}
		j[side] = objective(m, seq);
	}
	memcpy(m->rep_w, w_rep, (size_t)m->rep_n * sizeof(float));
	memcpy(m->exp_w, w_exp, (size_t)m->exp_n * sizeof(float));
	free(w_rep);
	free(w_exp);
	const double fd = (j[0] - j[1]) / (2.0 * eps), err = fabs(fd - norm_sq) / norm_sq;
	const int ok = err <= TOLERANCE;
	rmoe_app_say("  %-12s |g|^2 %.6e  finite difference %.6e  relative error %.2e: %s\n", group, norm_sq,
	             fd, err, ok ? "ok" : "FAIL");
	if (!ok)
		failures++;
}

static int run(rmoe_ctx *ctx, enum rmoe_dispatch d, int nranks)
{
	struct rmoe_train_shape s = {.layers = 2, .hidden = 16, .ffn = 8, .experts = 2 * nranks, .topk = 2,
	                             .vocab = 24, .tokens = 48, .shared_ffn = 8};
	struct rmoe_corpus corpus;
	char msg[256];
	if (rmoe_corpus_markov(&corpus, s.vocab, 3, 11, msg, sizeof(msg)))
		return 1;
	struct rmoe_corpus_state ds;
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	rmoe_corpus_start(&corpus, rank, &ds);
	int32_t seq[49];
	rmoe_corpus_next(&corpus, rank, &ds, s.tokens, seq);
	struct rmoe_train_model m;
	/* A large auxiliary weight, so its gradient is a visible part of J's. */
	if (rmoe_train_model_init(&m, ctx, &s, d, 0.5, 7)) {
		rmoe_corpus_free(&corpus);
		return 1;
	}
	struct rmoe_train_result r;
	int rc = rmoe_train_model_step(&m, seq, &r);
	if (!rc) {
		rmoe_app_say("%s: J = %.6f (cross-entropy %.6f, aux %.6f)\n", rmoe_dispatch_name(d),
		             r.loss + r.aux, r.loss, r.aux);
		float *g_rep = malloc((size_t)m.rep_n * sizeof(float));
		float *g_exp = malloc((size_t)m.exp_n * sizeof(float));
		memcpy(g_rep, m.rep_g, (size_t)m.rep_n * sizeof(float));
		memcpy(g_exp, m.exp_g, (size_t)m.exp_n * sizeof(float));
		const char *groups[] = {"embedding", ".norm", "router", "shared", "final_norm", "head",
		                        "experts"};
		for (size_t i = 0; i < sizeof(groups) / sizeof(groups[0]); i++)
			check_group(&m, seq, groups[i], g_rep, g_exp);
		free(g_rep);
		free(g_exp);
	}
	rmoe_train_model_free(&m);
	rmoe_corpus_free(&corpus);
	return rc;
}

int main(int argc, char **argv)
{
	int nranks;
	/* Never NULL: a context that cannot be made fails the test there. */
	rmoe_ctx *ctx = rmoe_test_start(&argc, &argv, &nranks);
	int rc = run(ctx, RMOE_DISPATCH_RING_EXPERT, nranks);
	if (!rc)
		rc = run(ctx, RMOE_DISPATCH_ALLTOALL, nranks);
	rmoe_ctx_destroy(ctx);
	rmoe_app_say("test_train_grad: %s\n", rc ? "error" : failures ? "FAIL" : "ok");
	MPI_Finalize();
	return rc || failures ? 1 : 0;
}
