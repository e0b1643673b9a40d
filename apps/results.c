/* What a layer run gives back, and what the programs do with it: two
 * runs compared, one checked against the double-precision reference (kept
 * for the next check of the same problem), inputs and outputs written as
 * .npy files. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "messages.h"
#include "npy.h"
#include "problem.h"
#include "results.h"
#include "rmoe_reference.h"

/* The reference of a problem on rank 0: its outputs and gradients for the
 * routing the layer chose (near-ties followed, rmoe_ref_route). Kept in the
 * problem for its next check: every dispatcher of a run routes alike, so
 * `relaymoe run --check` computes it once, not once per dispatcher (the
 * double-precision loops dominate a checked run). */
struct reference {
	int32_t *hint;              /* the routing it was computed for [TT, K] */
	uint64_t inputs;            /* digest of the inputs and weights it was computed from */
	int64_t near_ties;          /* -1: the hint was wrong */
	float *y;
	struct rmoe_ref_grads rg;
};
static void reference_free(struct reference *c)
{
	void *all[] = {c->hint, c->y, c->rg.dx, c->rg.dw_router, c->rg.dw_gate, c->rg.dw_up, c->rg.dw_down,
	               c->rg.dws_gate, c->rg.dws_up, c->rg.dws_down, c->rg.dw_shared_expert_gate};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(all[i]);
	memset(c, 0, sizeof(*c));
}

/* How the problem frees what it keeps (rmoe_problem_free). */
static void reference_destroy(void *data)
{
	if (data)
		reference_free(data);
	free(data);
}

int rmoe_results_alloc(struct rmoe_results *r, const struct rmoe_problem *p)
{
	memset(r, 0, sizeof(*r));
	const int64_t H = p->cfg.hidden, T = p->tokens, HF = H * p->cfg.ffn, Fs = p->cfg.shared_ffn;
	r->y = rmoe_app_falloc(T * H);
	r->dx = rmoe_app_falloc(T * H);
	r->dw_router = rmoe_app_falloc(H * p->cfg.experts);
	r->dw_gate = rmoe_app_falloc(p->e_local * HF);
	r->dw_up = rmoe_app_falloc(p->e_local * HF);
	r->dw_down = rmoe_app_falloc(p->e_local * HF);
	/* at least one element: malloc(0) may give NULL, which reads as out of
	 * memory, on a rank without tokens */
	r->topk_idx = malloc((size_t)(T > 0 ? T * p->cfg.topk : 1) * sizeof(int32_t));
	if (Fs > 0) {
		r->dws_gate = rmoe_app_falloc(H * Fs);
		r->dws_up = rmoe_app_falloc(H * Fs);
		r->dws_down = rmoe_app_falloc(H * Fs);
	}
	if (p->w_sgate)
		r->dw_sgate = rmoe_app_falloc(H);
	if (!r->y || !r->dx || !r->dw_router || !r->dw_gate || !r->dw_up || !r->dw_down || !r->topk_idx ||
	    (Fs > 0 && (!r->dws_gate || !r->dws_up || !r->dws_down)) || (p->w_sgate && !r->dw_sgate))
		return RMOE_ENOMEM;
	return 0;
}

int rmoe_problem_run(rmoe_ctx *ctx, const struct rmoe_layer_config *cfg, const struct rmoe_problem *p,
                     struct rmoe_results *r, struct rmoe_layer_stats *st)
{
	rmoe_layer *layer = NULL;
	memset(r, 0, sizeof(*r));
	int rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, cfg));
	if (!rc)
		rc = rmoe_app_agree(rmoe_problem_apply(p, layer));
	if (!rc)
		rc = rmoe_app_agree(rmoe_results_alloc(r, p));
	if (!rc)
		rc = rmoe_app_agree(rmoe_layer_forward(layer, p->x, r->y));
	if (!rc)
		rc = rmoe_app_agree(rmoe_layer_backward(layer, p->dy, r->dx));
	if (!rc)
		rc = rmoe_app_agree(rmoe_results_collect(r, p, layer));
	if (!rc && st)
		rmoe_layer_get_stats(layer, st);
	rmoe_layer_destroy(layer);
	return rc;
}

void rmoe_results_free(struct rmoe_results *r)
{
	free(r->y);
	free(r->dx);
	free(r->dw_router);
	free(r->dw_gate);
	free(r->dw_up);
	free(r->dw_down);
	free(r->dws_gate);
	free(r->dws_up);
	free(r->dws_down);
	free(r->dw_sgate);
	free(r->topk_idx);
	memset(r, 0, sizeof(*r));
}

int rmoe_results_collect(struct rmoe_results *r, const struct rmoe_problem *p, rmoe_layer *layer)
{
	const int64_t HF = p->cfg.hidden * p->cfg.ffn;
	int rc = rmoe_layer_get_grad_router(layer, r->dw_router);
	for (int64_t e = 0; e < p->e_local && !rc; e++)
		rc = rmoe_layer_get_grad_expert(layer, p->first_expert + e, r->dw_gate + e * HF,
		                                r->dw_up + e * HF, r->dw_down + e * HF);
	if (!rc && p->cfg.shared_ffn > 0)
		rc = rmoe_layer_get_grad_shared(layer, r->dws_gate, r->dws_up, r->dws_down);
	if (!rc && p->w_sgate)
		rc = rmoe_layer_get_grad_shared_expert_gate(layer, r->dw_sgate);
	if (!rc)
		rc = rmoe_layer_get_routing(layer, r->topk_idx, NULL, NULL);
	return rc;
}


/* The tensors compared, with their local element counts. */
struct tensor_view {
	const char *name;
	const float *a;
	int64_t n;
};

static int views(const struct rmoe_results *r, const struct rmoe_problem *p, struct tensor_view *v)
{
	const int64_t H = p->cfg.hidden, T = p->tokens, HF = H * p->cfg.ffn, Fs = p->cfg.shared_ffn;
	int n = 0;
	v[n++] = (struct tensor_view){"y", r->y, T * H};
	v[n++] = (struct tensor_view){"dx", r->dx, T * H};
	v[n++] = (struct tensor_view){"dw_router", r->dw_router, H * p->cfg.experts};
	v[n++] = (struct tensor_view){"dw_gate", r->dw_gate, p->e_local * HF};
	v[n++] = (struct tensor_view){"dw_up", r->dw_up, p->e_local * HF};
	v[n++] = (struct tensor_view){"dw_down", r->dw_down, p->e_local * HF};
	if (Fs > 0) {
		v[n++] = (struct tensor_view){"dw_shared_gate", r->dws_gate, H * Fs};
		v[n++] = (struct tensor_view){"dw_shared_up", r->dws_up, H * Fs};
		v[n++] = (struct tensor_view){"dw_shared_down", r->dws_down, H * Fs};
	}
	if (p->w_sgate)
		v[n++] = (struct tensor_view){"dw_shared_expert_gate", r->dw_sgate, H};
	return n;
}

double rmoe_results_max_rel_diff(const struct rmoe_results *a, const struct rmoe_results *b,
                                 const struct rmoe_problem *p, const char **worst)
{
	struct tensor_view va[10], vb[10];
	int n = views(a, p, va);
	views(b, p, vb);
	double maxerr = 0;
	*worst = "none";
	for (int i = 0; i < n; i++) {
		double s[2] = {0, 0}, g[2];
		for (int64_t j = 0; j < va[i].n; j++) {
			double d = (double)va[i].a[j] - vb[i].a[j];
			s[0] += d * d;
			s[1] += (double)vb[i].a[j] * vb[i].a[j];
		}
		MPI_Allreduce(s, g, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		double err = sqrt(g[0]) / (g[1] > 0 ? sqrt(g[1]) : 1e-300);
		if (i == 0 || !(err <= maxerr)) { /* NaN counts as worst */
			maxerr = err;
			*worst = va[i].name;
		}
	}
	return maxerr;
}

/* Gathers count floats per rank into root's dst (rank order). */
static void gather(const float *src, int64_t count, float *dst)
{
	/* Counts above INT_MAX would need derived types; the sizes checked at
	 * layer creation keep one rank's share far below that here. */
	MPI_Gather(src, (int)count, MPI_FLOAT, dst, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

/* Gathers every rank's token rows of width elements of type t (its
 * p->rank_tokens[r] rows) into root's dst, in rank order: the global
 * [total_tokens, width] tensor. Counted in rows, so the offsets stay
 * within an int up to 2^31 tokens over all ranks. 0 or RMOE_ENOMEM, on
 * every rank. */
static int gather_rows(const struct rmoe_problem *p, const void *src, int64_t width, MPI_Datatype t, void *dst)
{
	int *counts = malloc((size_t)p->nranks * sizeof(int)), *displs = malloc((size_t)p->nranks * sizeof(int));
	int rc = rmoe_app_agree(counts && displs ? 0 : RMOE_ENOMEM);
	if (!rc) {
		for (int r = 0; r < p->nranks; r++) {
			counts[r] = (int)p->rank_tokens[r];
			displs[r] = r ? displs[r - 1] + counts[r - 1] : 0;
		}
		MPI_Datatype row;
		MPI_Type_contiguous((int)width, t, &row);
		MPI_Type_commit(&row);
		MPI_Gatherv(src, (int)p->tokens, row, dst, counts, displs, row, 0, MPI_COMM_WORLD);
		MPI_Type_free(&row);
	}
	free(counts);
	free(displs);
	return rc;
}

/* Everything the reference needs, on rank 0. */
struct global {
	float *x, *dy, *y, *dx, *w_gate, *w_up, *w_down, *dw_gate, *dw_up, *dw_down, *dw_router;
	float *dws[3];            /* shared-expert gradients summed over ranks */
	float *dw_sgate;          /* its gate's, summed over ranks */
	int32_t *idx;
};

static void global_free(struct global *g)
{
	void *all[] = {g->x,      g->dy,     g->y,       g->dx,     g->w_gate, g->w_up,   g->w_down, g->dw_gate,
	               g->dw_up,  g->dw_down, g->dw_router, g->dws[0], g->dws[1], g->dws[2], g->dw_sgate, g->idx};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(all[i]);
}

static int global_gather(const struct rmoe_results *r, const struct rmoe_problem *p, struct global *g)
{
	memset(g, 0, sizeof(*g));
	const int64_t TT = p->total_tokens, H = p->cfg.hidden, E = p->cfg.experts, K = p->cfg.topk,
	              HF = H * p->cfg.ffn, el = p->e_local;
	int root = p->rank == 0, rc = 0;
	if (root) {
		g->x = rmoe_app_falloc(TT * H);
		g->dy = rmoe_app_falloc(TT * H);
		g->y = rmoe_app_falloc(TT * H);
		g->dx = rmoe_app_falloc(TT * H);
		g->w_gate = rmoe_app_falloc(E * HF);
		g->w_up = rmoe_app_falloc(E * HF);
		g->w_down = rmoe_app_falloc(E * HF);
		g->dw_gate = rmoe_app_falloc(E * HF);
		g->dw_up = rmoe_app_falloc(E * HF);
		g->dw_down = rmoe_app_falloc(E * HF);
		g->dw_router = rmoe_app_falloc(H * E);
		g->idx = malloc((size_t)(TT > 0 ? TT * K : 1) * sizeof(int32_t));
		for (int i = 0; i < 3 && p->cfg.shared_ffn > 0; i++)
			if (!(g->dws[i] = rmoe_app_falloc(H * p->cfg.shared_ffn)))
				rc = RMOE_ENOMEM;
		if (p->w_sgate && !(g->dw_sgate = rmoe_app_falloc(p->cfg.hidden)))
			rc = RMOE_ENOMEM;
		if (!g->x || !g->dy || !g->y || !g->dx || !g->w_gate || !g->w_up || !g->w_down ||
		    !g->dw_gate || !g->dw_up || !g->dw_down || !g->dw_router || !g->idx)
			rc = RMOE_ENOMEM;
	}
	if ((rc = rmoe_app_agree(rc))) {
		global_free(g);
		return rc;
	}
	const void *rows_src[] = {p->x, p->dy, r->y, r->dx};
	void *rows_dst[] = {g->x, g->dy, g->y, g->dx};
	for (int i = 0; i < 4 && !rc; i++)
		rc = gather_rows(p, rows_src[i], H, MPI_FLOAT, rows_dst[i]);
	if (!rc)
		rc = gather_rows(p, r->topk_idx, K, MPI_INT32_T, g->idx);
	if (rc) {
		global_free(g);
		return rc;
	}
	gather(p->w_gate, el * HF, g->w_gate);
	gather(p->w_up, el * HF, g->w_up);
	gather(p->w_down, el * HF, g->w_down);
	gather(r->dw_gate, el * HF, g->dw_gate);
	gather(r->dw_up, el * HF, g->dw_up);
	gather(r->dw_down, el * HF, g->dw_down);
	MPI_Reduce(r->dw_router, g->dw_router, (int)(H * E), MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
	const float *dws[3] = {r->dws_gate, r->dws_up, r->dws_down};
	for (int i = 0; i < 3 && p->cfg.shared_ffn > 0; i++)
		MPI_Reduce(dws[i], g->dws[i], (int)(H * p->cfg.shared_ffn), MPI_FLOAT, MPI_SUM, 0,
		           MPI_COMM_WORLD);
	if (p->w_sgate)
		MPI_Reduce(r->dw_sgate, g->dw_sgate, (int)H, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
	return 0;
}

/* FNV-1a over n floats' bytes, continuing h. */
static uint64_t digest(uint64_t h, const float *v, int64_t n)
{
	const unsigned char *b = (const unsigned char *)v;
	for (size_t i = 0; v && i < (size_t)n * sizeof(float); i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

/* The reference for the gathered g (its inputs rounded in place to the
 * layer's element type), from the cache when p and the routing match. */
static const struct reference *reference_for(const struct rmoe_problem *p, struct global *g)
{
	const int64_t TT = p->total_tokens, H = p->cfg.hidden, E = p->cfg.experts, K = p->cfg.topk,
	              HF = H * p->cfg.ffn, Fs = p->cfg.shared_ffn;
	/* The reference of a bf16 layer is the layer's definition on the
	 * values it stores: inputs and expert weights rounded to bf16 (the
	 * router and the shared expert's gate stay fp32). */
	const enum rmoe_dtype dt = p->cfg.dtype;
	float *rounded[] = {g->x, g->dy, g->w_gate, g->w_up, g->w_down};
	const int64_t sizes[] = {TT * H, TT * H, E * HF, E * HF, E * HF};
	for (int i = 0; i < 5; i++)
		rmoe_round_to_dtype(rounded[i], sizes[i], dt);
	const size_t idx_bytes = (size_t)(TT * K) * sizeof(int32_t);
	uint64_t h = 14695981039346656037ull;
	const float *in[] = {g->x, g->dy, p->w_router, g->w_gate, g->w_up, g->w_down, p->ws_gate, p->ws_up, p->ws_down,
	                     p->w_sgate};
	const int64_t n_in[] = {TT * H, TT * H, H * E, E * HF, E * HF, E * HF, H * Fs, H * Fs, H * Fs, H};
	for (int i = 0; i < 10; i++)
		h = digest(h, in[i], n_in[i]);
	/* Out of memory for the kept reference, the check fails as for a
	 * reference that could not be computed. */
	static const struct reference none = {.near_ties = -1};
	struct rmoe_problem_kept *kept = p->kept;
	if (!kept->data && (kept->data = calloc(1, sizeof(struct reference))))
		kept->release = reference_destroy;
	struct reference *c = kept->data;
	if (!c)
		return &none;
	if (c->inputs == h && c->hint && memcmp(c->hint, g->idx, idx_bytes) == 0)
		return c;
	reference_free(c);
	float *ws[3] = {NULL, NULL, NULL};
	const float *ws_src[3] = {p->ws_gate, p->ws_up, p->ws_down};
	for (int i = 0; i < 3 && Fs > 0; i++)
		if ((ws[i] = rmoe_app_falloc(H * Fs))) {
			memcpy(ws[i], ws_src[i], (size_t)(H * Fs) * sizeof(float));
			rmoe_round_to_dtype(ws[i], H * Fs, dt);
		}
	struct rmoe_ref_layer L = {H, p->cfg.ffn, E, K, p->cfg.norm_topk, Fs, p->w_router,
	                           g->w_gate, g->w_up, g->w_down, ws[0], ws[1], ws[2],
	                           p->w_sgate != NULL, p->w_sgate};
	float *probs = rmoe_app_falloc(TT * E), *tw = rmoe_app_falloc(TT * K);
	int32_t *idx = malloc(idx_bytes);
	*c = (struct reference){malloc(idx_bytes), h, 0, rmoe_app_falloc(TT * H),
	                        {rmoe_app_falloc(TT * H), rmoe_app_falloc(H * E), rmoe_app_falloc(E * HF),
	                         rmoe_app_falloc(E * HF), rmoe_app_falloc(E * HF),
	                         Fs ? rmoe_app_falloc(H * Fs) : NULL, Fs ? rmoe_app_falloc(H * Fs) : NULL,
	                         Fs ? rmoe_app_falloc(H * Fs) : NULL, p->w_sgate ? rmoe_app_falloc(H) : NULL}};
	if (!c->hint || !c->y || !c->rg.dx) {
		reference_free(c);
		c->near_ties = -1;
	} else {
		memcpy(c->hint, g->idx, idx_bytes);
		/* A float32 near-tie in the router may pick another expert than
		 * the double-precision reference; the reference then follows the
		 * layer's choice, but only where it is within tie_tol of the K-th
		 * best. */
		c->near_ties = rmoe_ref_route(&L, TT, g->x, probs, idx, tw, g->idx, 1e-5);
		if (c->near_ties >= 0) {
			rmoe_ref_forward(&L, TT, g->x, idx, tw, c->y);
			rmoe_ref_backward(&L, TT, g->x, probs, idx, tw, g->dy, &c->rg);
		}
	}
	free(probs);
	free(tw);
	free(idx);
	for (int i = 0; i < 3; i++)
		free(ws[i]);
	return c;
}

double rmoe_results_check(const struct rmoe_results *r, const struct rmoe_problem *p,
                          const char **worst, int64_t *near_ties)
{
	struct global g;
	*worst = "none";
	*near_ties = 0;
	if (global_gather(r, p, &g))
		return INFINITY;
	double maxerr = 0;
	if (p->rank == 0) {
		const int64_t TT = p->total_tokens, H = p->cfg.hidden, E = p->cfg.experts,
		              HF = H * p->cfg.ffn, Fs = p->cfg.shared_ffn;
		const struct reference *ref = reference_for(p, &g);
		const struct rmoe_ref_grads *rg = &ref->rg;
		*near_ties = ref->near_ties;
		if (*near_ties < 0) {
			maxerr = INFINITY;
			*worst = "routing";
		} else {
			struct {
				const char *name;
				const float *got, *want;
				int64_t n;
			} cmp[] = {
				{"y", g.y, ref->y, TT * H},
				{"dx", g.dx, rg->dx, TT * H},
				{"dw_router", g.dw_router, rg->dw_router, H * E},
				{"dw_gate", g.dw_gate, rg->dw_gate, E * HF},
				{"dw_up", g.dw_up, rg->dw_up, E * HF},
				{"dw_down", g.dw_down, rg->dw_down, E * HF},
				{"dw_shared_gate", g.dws[0], rg->dws_gate, H * Fs},
				{"dw_shared_up", g.dws[1], rg->dws_up, H * Fs},
				{"dw_shared_down", g.dws[2], rg->dws_down, H * Fs},
				{"dw_shared_expert_gate", g.dw_sgate, rg->dw_shared_expert_gate, H},
			};
			int ncmp = p->w_sgate ? 10 : Fs > 0 ? 9 : 6;
			for (int i = 0; i < ncmp; i++) {
				double e = rmoe_ref_rel_err(cmp[i].got, cmp[i].want, cmp[i].n);
				if (i == 0 || !(e <= maxerr)) {
					maxerr = e;
					*worst = cmp[i].name;
				}
			}
		}
	}
	global_free(&g);
	MPI_Bcast(&maxerr, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
	MPI_Bcast(near_ties, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
	return maxerr;
}

static int write_npy(const char *dir, const char *name, int ndim, const int64_t *shape, const float *data)
{
	char path[4096], msg[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int rc = rmoe_npy_write_f32(path, ndim, shape, data, msg, sizeof(msg));
	if (rc)
		rmoe_app_error("%s", msg);
	return rc;
}

int rmoe_results_dump(const struct rmoe_results *r, const struct rmoe_problem *p, const char *dir)
{
	int rc = 0;
	if (p->rank == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST) {
		rmoe_app_error("--dump %s: cannot create the directory (%s)", dir, strerror(errno));
		rc = RMOE_EIO;
	}
	if ((rc = rmoe_app_agree(rc)))
		return rc;
	struct global g;
	if ((rc = global_gather(r, p, &g)))
		return rc;
	if (p->rank == 0) {
		const int64_t TT = p->total_tokens, H = p->cfg.hidden, E = p->cfg.experts, F = p->cfg.ffn;
		int64_t sx[2] = {TT, H}, sr[2] = {H, E}, sg[3] = {E, H, F}, sd[3] = {E, F, H};
		int64_t ssg[2] = {H, p->cfg.shared_ffn}, ssd[2] = {p->cfg.shared_ffn, H}, sgate[1] = {H};
		struct {
			const char *name;
			int ndim;
			const int64_t *shape;
			const float *data;
		} out[] = {
			{"x.npy", 2, sx, g.x},           {"dy.npy", 2, sx, g.dy},
			{"w_router.npy", 2, sr, p->w_router}, {"w_gate.npy", 3, sg, g.w_gate},
			{"w_up.npy", 3, sg, g.w_up},     {"w_down.npy", 3, sd, g.w_down},
			{"y.npy", 2, sx, g.y},           {"dx.npy", 2, sx, g.dx},
			{"dw_router.npy", 2, sr, g.dw_router}, {"dw_gate.npy", 3, sg, g.dw_gate},
			{"dw_up.npy", 3, sg, g.dw_up},   {"dw_down.npy", 3, sd, g.dw_down},
			{"w_shared_gate.npy", 2, ssg, p->ws_gate}, {"w_shared_up.npy", 2, ssg, p->ws_up},
			{"w_shared_down.npy", 2, ssd, p->ws_down}, {"dw_shared_gate.npy", 2, ssg, g.dws[0]},
			{"dw_shared_up.npy", 2, ssg, g.dws[1]},  {"dw_shared_down.npy", 2, ssd, g.dws[2]},
			{"w_shared_expert_gate.npy", 1, sgate, p->w_sgate}, {"dw_shared_expert_gate.npy", 1, sgate, g.dw_sgate},
		};
		unsigned nout = p->w_sgate ? 20 : p->cfg.shared_ffn > 0 ? 18 : 12;
		for (unsigned i = 0; i < nout && !rc; i++)
			rc = write_npy(dir, out[i].name, out[i].ndim, out[i].shape, out[i].data);
		/* The layer's routing, for a peer to compare at equal routing where
		 * the router is within its precision of a tie (torch_moe.py). */
		int64_t si[2] = {TT, p->cfg.topk};
		char path[4096], msg[512];
		snprintf(path, sizeof(path), "%s/topk_idx.npy", dir);
		if (!rc && (rc = rmoe_npy_write_i32(path, 2, si, g.idx, msg, sizeof(msg))))
			rmoe_app_error("%s", msg);
	}
	global_free(&g);
	return rmoe_app_agree(rc);
}
