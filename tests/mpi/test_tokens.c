/* Multi-rank: token counts that differ between ranks and change from call
 * to call on one layer (rmoe_layer_set_tokens), 0 tokens on a rank and a
 * count above the capacity (which grows it) included, for every
 * dispatcher, f32 and bf16, with and without a shared expert, against the
 * single-process reference over every rank's tokens. Run under
 * mpiexec -n N (N = 1..4). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "messages.h"
#include "rmoe_reference.h"
#include "seeded.h"

/* fp32 against a double reference; bf16 storage of every activation (the
 * reference sees the same rounded inputs and weights). */
#define TOL_F32 1e-5
#define TOL_BF16 3e-2

static int failures;

static void expect(int ok, const char *what, double value)
{
	if (!ok) {
		rmoe_app_say("FAIL %s (%.3e)\n", what, value);
		failures++;
	}
}

/* The layer's weights, every expert, drawn alike on every rank. */
struct weights {
	int64_t H, F, E, K, Fs;
	float *router, *gate, *up, *down, *sgate, *sup, *sdown;
};

static float *draw(int64_t n, uint64_t seed, double scale, enum rmoe_dtype dt)
{
	float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
	if (!v)
		return NULL;
	rmoe_seeded_uniform(v, n, 44, RMOE_STREAM_USER + seed, 0, (float)scale);
	rmoe_round_to_dtype(v, n, dt);
	return v;
}

static int weights_init(struct weights *w, int64_t H, int64_t F, int64_t E, int64_t K, int64_t Fs,
                        enum rmoe_dtype dt)
{
	*w = (struct weights){H, F, E, K, Fs, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
	/* The router stays fp32 in a bf16 layer. */
	w->router = draw(H * E, 11, 1.0, RMOE_DTYPE_F32);
	w->gate = draw(E * H * F, 12, 0.5, dt);
	w->up = draw(E * H * F, 13, 0.5, dt);
	w->down = draw(E * F * H, 14, 0.5, dt);
	if (Fs > 0) {
		w->sgate = draw(H * Fs, 15, 0.5, dt);
		w->sup = draw(H * Fs, 16, 0.5, dt);
		w->sdown = draw(Fs * H, 17, 0.5, dt);
	}
	return w->router && w->gate && w->up && w->down && (Fs == 0 || (w->sgate && w->sup && w->sdown)) ? 0
	                                                                                                 : RMOE_ENOMEM;
}

static void weights_free(struct weights *w)
{
	float *all[] = {w->router, w->gate, w->up, w->down, w->sgate, w->sup, w->sdown};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(all[i]);
}

static int weights_apply(const struct weights *w, rmoe_layer *layer)
{
	int64_t first, count;
	const int64_t HF = w->H * w->F;
	int rc = rmoe_layer_set_router(layer, w->router);
	if (!rc)
		rc = rmoe_layer_owned_experts(layer, &first, &count);
	for (int64_t e = first; !rc && e < first + count; e++)
		rc = rmoe_layer_set_expert(layer, e, w->gate + e * HF, w->up + e * HF, w->down + e * HF);
	if (!rc && w->Fs > 0)
		rc = rmoe_layer_set_shared(layer, w->sgate, w->sup, w->sdown);
	return rc;
}

/* Rows of every rank into root's all (rank order). */
static void gather_rows(const float *mine, int64_t rows, int64_t width, const int64_t *counts, int nranks,
                        float *all)
{
	int *cnt = malloc(sizeof(int) * (size_t)nranks), *off = malloc(sizeof(int) * (size_t)nranks);
	for (int r = 0, o = 0; r < nranks; r++) {
		cnt[r] = (int)(counts[r] * width);
		off[r] = o;
		o += cnt[r];
	}
	MPI_Gatherv(mine, (int)(rows * width), MPI_FLOAT, all, cnt, off, MPI_FLOAT, 0, MPI_COMM_WORLD);
	free(cnt);
	free(off);
}

static void gather_idx(const int32_t *mine, int64_t rows, int64_t K, const int64_t *counts, int nranks,
                       int32_t *all)
{
	int *cnt = malloc(sizeof(int) * (size_t)nranks), *off = malloc(sizeof(int) * (size_t)nranks);
	for (int r = 0, o = 0; r < nranks; r++) {
		cnt[r] = (int)(counts[r] * K);
		off[r] = o;
		o += cnt[r];
	}
	MPI_Gatherv(mine, (int)(rows * K), MPI_INT32_T, all, cnt, off, MPI_INT32_T, 0, MPI_COMM_WORLD);
	free(cnt);
	free(off);
}

/* One call's outputs against the reference: y and dx over every rank's
 * tokens, the router's gradient summed, every expert's gathered. The
 * largest relative error, the same on every rank. */
static double check_call(rmoe_layer *layer, const struct weights *w, const int64_t *counts, int nranks, int rank,
                         const float *x, const float *dy, const float *y, const float *dx)
{
	const int64_t H = w->H, E = w->E, K = w->K, HF = H * w->F, T = counts[rank];
	int64_t total = 0, first, owned;
	for (int r = 0; r < nranks; r++)
		total += counts[r];
	rmoe_layer_owned_experts(layer, &first, &owned);
	float *dwr = malloc(sizeof(float) * (size_t)(H * E)), *dwr_all = malloc(sizeof(float) * (size_t)(H * E));
	float *dg = malloc(sizeof(float) * (size_t)(E * HF)), *du = malloc(sizeof(float) * (size_t)(E * HF));
	float *dd = malloc(sizeof(float) * (size_t)(E * HF));
	int32_t *idx = malloc(sizeof(int32_t) * (size_t)(T * K + 1));
	rmoe_layer_get_grad_router(layer, dwr);
	rmoe_layer_get_routing(layer, idx, NULL, NULL);
	for (int64_t e = 0; e < owned; e++)
		rmoe_layer_get_grad_expert(layer, first + e, dg + e * HF, du + e * HF, dd + e * HF);
	MPI_Reduce(dwr, dwr_all, (int)(H * E), MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
	/* Every rank owns as many experts: rank order is expert order. */
	float *gg = NULL, *gu = NULL, *gd = NULL, *gx = NULL, *gdy = NULL, *gy = NULL, *gdx = NULL;
	int32_t *gidx = NULL;
	if (rank == 0) {
		gg = malloc(sizeof(float) * (size_t)(E * HF));
		gu = malloc(sizeof(float) * (size_t)(E * HF));
		gd = malloc(sizeof(float) * (size_t)(E * HF));
		gx = malloc(sizeof(float) * (size_t)(total * H + 1));
		gdy = malloc(sizeof(float) * (size_t)(total * H + 1));
		gy = malloc(sizeof(float) * (size_t)(total * H + 1));
		gdx = malloc(sizeof(float) * (size_t)(total * H + 1));
		gidx = malloc(sizeof(int32_t) * (size_t)(total * K + 1));
	}
	MPI_Gather(dg, (int)(owned * HF), MPI_FLOAT, gg, (int)(owned * HF), MPI_FLOAT, 0, MPI_COMM_WORLD);
	MPI_Gather(du, (int)(owned * HF), MPI_FLOAT, gu, (int)(owned * HF), MPI_FLOAT, 0, MPI_COMM_WORLD);
	MPI_Gather(dd, (int)(owned * HF), MPI_FLOAT, gd, (int)(owned * HF), MPI_FLOAT, 0, MPI_COMM_WORLD);
	gather_rows(x, T, H, counts, nranks, gx);
	gather_rows(dy, T, H, counts, nranks, gdy);
	gather_rows(y, T, H, counts, nranks, gy);
	gather_rows(dx, T, H, counts, nranks, gdx);
	gather_idx(idx, T, K, counts, nranks, gidx);
	double err = 0;
	if (rank == 0) {
		struct rmoe_ref_layer ref = {H, w->F, E, K, 1, w->Fs, w->router, w->gate, w->up, w->down,
		                             w->sgate, w->sup, w->sdown, 0, NULL};
		const int64_t n = total > 0 ? total : 1;
		float *probs = malloc(sizeof(float) * (size_t)(n * E)), *tw = malloc(sizeof(float) * (size_t)(n * K));
		int32_t *ti = malloc(sizeof(int32_t) * (size_t)(n * K));
		float *ry = malloc(sizeof(float) * (size_t)(n * H)), *rdx = malloc(sizeof(float) * (size_t)(n * H));
		struct rmoe_ref_grads g = {rdx, malloc(sizeof(float) * (size_t)(H * E)),
		                           malloc(sizeof(float) * (size_t)(E * HF)), malloc(sizeof(float) * (size_t)(E * HF)),
		                           malloc(sizeof(float) * (size_t)(E * HF)), NULL, NULL, NULL, NULL};
		if (w->Fs > 0)
			for (int i = 0; i < 3; i++)
				(&g.dws_gate)[i] = malloc(sizeof(float) * (size_t)(H * w->Fs));
		if (rmoe_ref_route(&ref, total, gx, probs, ti, tw, gidx, 1e-5) < 0)
			err = INFINITY;
		rmoe_ref_forward(&ref, total, gx, ti, tw, ry);
		rmoe_ref_backward(&ref, total, gx, probs, ti, tw, gdy, &g);
		const double e[] = {total ? rmoe_ref_rel_err(gy, ry, total * H) : 0,
		                    total ? rmoe_ref_rel_err(gdx, rdx, total * H) : 0,
		                    rmoe_ref_rel_err(dwr_all, g.dw_router, H * E), rmoe_ref_rel_err(gg, g.dw_gate, E * HF),
		                    rmoe_ref_rel_err(gu, g.dw_up, E * HF), rmoe_ref_rel_err(gd, g.dw_down, E * HF)};
		for (size_t i = 0; i < sizeof(e) / sizeof(e[0]); i++)
			if (!(e[i] <= err))
				err = e[i];
		free(probs), free(tw), free(ti), free(ry), free(rdx), free(g.dw_router), free(g.dw_gate), free(g.dw_up);
		free(g.dw_down), free(g.dws_gate), free(g.dws_up), free(g.dws_down);
	}
	MPI_Bcast(&err, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
	free(dwr), free(dwr_all), free(dg), free(du), free(dd), free(idx), free(gg), free(gu), free(gd);
	free(gx), free(gdy), free(gy), free(gdx), free(gidx);
	return err;
}

/* The calls' counts: rank r's tokens at call c. Uneven; then rank 0 empty;
 * then every rank alike; then the last rank above the capacity (the layer
 * grows) with the others small; then every rank empty but one; then every
 * rank empty. */
enum { CALLS = 6, CAPACITY = 24 };
static int64_t count_of(int c, int r, int nranks)
{
	switch (c) {
	case 0: return 5 + 7 * r;
	case 1: return r == 0 ? 0 : 17;
	case 2: return 12;
	case 3: return r == nranks - 1 ? CAPACITY + 9 : 3;
	case 4: return r == nranks - 1 ? 6 : 0;
	default: return 0;
	}
}

static void run_case(rmoe_ctx *ctx, enum rmoe_dispatch d, enum rmoe_dtype dt, int64_t Fs, int64_t chunk)
{
	int nranks, rank;
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	const int64_t H = 16, F = 8, E = 2 * nranks, K = 2;
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, H, F, E, K, CAPACITY);
	cfg.dispatch = d;
	cfg.dtype = dt;
	cfg.shared_ffn = Fs;
	cfg.chunk_rows = chunk;
	struct weights w;
	rmoe_layer *layer = NULL;
	int rc = rmoe_app_agree(weights_init(&w, H, F, E, K, Fs, dt));
	if (!rc)
		rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, &cfg));
	if (!rc)
		rc = rmoe_app_agree(weights_apply(&w, layer));
	char what[200];
	for (int c = 0; c < CALLS && !rc; c++) {
		int64_t counts[64];
		for (int r = 0; r < nranks; r++)
			counts[r] = count_of(c, r, nranks);
		const int64_t T = counts[rank];
		float *x = draw(T * H, 100 + 10 * (uint64_t)c + (uint64_t)rank, 1.0, dt);
		float *dy = draw(T * H, 500 + 10 * (uint64_t)c + (uint64_t)rank, 1.0, dt);
		float *y = malloc(sizeof(float) * (size_t)(T * H + 1)), *dx = malloc(sizeof(float) * (size_t)(T * H + 1));
		rc = rmoe_layer_set_tokens(layer, T);
		/* No tokens: the arrays may be NULL. */
		if (!rc)
			rc = rmoe_layer_forward(layer, T ? x : NULL, T ? y : NULL);
		if (!rc)
			rc = rmoe_layer_backward(layer, T ? dy : NULL, T ? dx : NULL);
		rc = rmoe_app_agree(rc);
		snprintf(what, sizeof(what), "%s %s shared %lld chunks %lld call %d: layer calls (%s)", rmoe_dispatch_name(d),
		         dt == RMOE_DTYPE_BF16 ? "bf16" : "f32", (long long)Fs, (long long)chunk, c,
		         rc ? rmoe_strerror(rc) : "ok");
		expect(rc == 0, what, 0);
		if (!rc) {
			double err = check_call(layer, &w, counts, nranks, rank, x, dy, y, dx);
			snprintf(what, sizeof(what), "%s %s shared %lld chunks %lld call %d vs reference", rmoe_dispatch_name(d),
			         dt == RMOE_DTYPE_BF16 ? "bf16" : "f32", (long long)Fs, (long long)chunk, c);
			expect(err <= (dt == RMOE_DTYPE_BF16 ? TOL_BF16 : TOL_F32), what, err);
			rmoe_app_say("  %-12s %-4s shared %-2lld chunks %lld call %d: rel err %.2e\n", rmoe_dispatch_name(d),
			             dt == RMOE_DTYPE_BF16 ? "bf16" : "f32", (long long)Fs, (long long)chunk, c, err);
		}
		free(x), free(dy), free(y), free(dx);
	}
	rmoe_layer_destroy(layer);
	weights_free(&w);
}

/* Under a memory cap a count above the capacity is refused on every rank,
 * naming the rank; a negative count at once. */
static void run_refusals(rmoe_ctx *ctx)
{
	int nranks, rank;
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 16, 8, 2 * nranks, 2, CAPACITY);
	cfg.mem_cap = 64 << 20;
	struct weights w;
	rmoe_layer *layer = NULL;
	int rc = rmoe_app_agree(weights_init(&w, 16, 8, 2 * nranks, 2, 0, RMOE_DTYPE_F32));
	if (!rc)
		rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, &cfg));
	if (!rc)
		rc = rmoe_app_agree(weights_apply(&w, layer));
	expect(rc == 0, "capped layer created", 0);
	if (!rc) {
		expect(rmoe_layer_set_tokens(layer, -1) == RMOE_EINVAL, "negative count refused", 0);
		const int64_t T = rank == nranks - 1 ? CAPACITY + 1 : 4;
		float *x = draw(T * 16, 900 + (uint64_t)rank, 1.0, RMOE_DTYPE_F32);
		float *y = malloc(sizeof(float) * (size_t)(T * 16));
		rmoe_layer_set_tokens(layer, T);
		rc = rmoe_layer_forward(layer, x, y);
		char want[64];
		snprintf(want, sizeof(want), "rank %d: %d tokens", nranks - 1, CAPACITY + 1);
		expect(rc == RMOE_EINVAL && strstr(rmoe_strerror(rc), want), "over the capped capacity refused", rc);
		/* The layer goes on at the capacity. */
		rmoe_layer_set_tokens(layer, 4);
		expect(rmoe_layer_forward(layer, x, y) == 0, "capped layer after the refusal", 0);
		free(x), free(y);
	}
	rmoe_layer_destroy(layer);
	weights_free(&w);
}

int main(int argc, char **argv)
{
	int nranks;
	rmoe_ctx *ctx = rmoe_test_start(&argc, &argv, &nranks);
	rmoe_app_say("test_tokens on %d rank(s)\n", nranks);
	const enum rmoe_dispatch ds[] = {RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_RING_TOKEN, RMOE_DISPATCH_ALLTOALL,
	                                 RMOE_DISPATCH_ALLTOALL_MEGATRON, RMOE_DISPATCH_ALLTOALL_DEEPEP};
	for (size_t i = 0; i < sizeof(ds) / sizeof(ds[0]); i++) {
		for (int dt = 0; dt < 2; dt++)
			run_case(ctx, ds[i], dt ? RMOE_DTYPE_BF16 : RMOE_DTYPE_F32, dt ? 0 : 8, 0);
		/* Chunked blocks and hops: the all-to-alls number their chunks'
		 * tags from the call's largest count, on every rank alike
		 * (DeepEP's whole blocks take no chunks). */
		if (ds[i] != RMOE_DISPATCH_ALLTOALL_DEEPEP)
			run_case(ctx, ds[i], RMOE_DTYPE_F32, 0, 3);
	}
	run_refusals(ctx);
	return rmoe_test_end(ctx, "test_tokens", failures);
}
