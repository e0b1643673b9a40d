/* Multi-rank: the _raw calls (activations in the layer's element type, in
 * main memory here; on a device in the gpu label) give bit for bit what the
 * float32 calls give, for ring, token and all-to-all in f32 and bf16 with
 * deterministic accumulation and a shared expert; their buffers come from
 * rmoe_ctx_alloc and rmoe_ctx_copy; bad arguments fail on every rank with
 * the same code. Run under mpiexec -n N. Device buffers (RMOE_MEMORY_DEVICE)
 * when the first argument is "device" and this rank has a CUDA worker. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "messages.h"
#include "problem.h"
#include "results.h"

static int failures;

static void expect(int ok, const char *what)
{
	if (!ok) {
		rmoe_app_say("FAIL %s\n", what);
		failures++;
	}
}

/* 0 when a and b hold the same bits (n floats). */
static int same(const float *a, const float *b, int64_t n)
{
	return memcmp(a, b, (size_t)n * sizeof(float));
}

/* The float32 calls into ref, the _raw calls into raw, for one dispatch
 * and element type. */
static void compare(rmoe_ctx *ctx, struct rmoe_layer_config cfg, enum rmoe_memory where)
{
	char what[200];
	struct rmoe_problem prob;
	if (rmoe_problem_init(&prob, &cfg, 11, NULL)) {
		expect(0, "problem init");
		return;
	}
	struct rmoe_results ref, raw;
	memset(&ref, 0, sizeof(ref));
	memset(&raw, 0, sizeof(raw));
	const int64_t n = cfg.tokens * cfg.hidden;
	const size_t bytes = (size_t)n * (cfg.dtype == RMOE_DTYPE_BF16 ? 2 : 4);
	void *x = NULL, *dy = NULL, *y = NULL, *dx = NULL, *stage = malloc(bytes);
	rmoe_layer *layer = NULL;
	int rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, &cfg));
	if (!rc)
		rc = rmoe_app_agree(rmoe_problem_apply(&prob, layer));
	if (!rc)
		rc = rmoe_app_agree(rmoe_results_alloc(&ref, &prob) || rmoe_results_alloc(&raw, &prob));
	if (!rc)
		rc = rmoe_app_agree(rmoe_ctx_alloc(ctx, where, bytes, &x) || rmoe_ctx_alloc(ctx, where, bytes, &dy) ||
		                    rmoe_ctx_alloc(ctx, where, bytes, &y) || rmoe_ctx_alloc(ctx, where, bytes, &dx));
	if (!rc) {
		rmoe_to_dtype(prob.x, stage, n, cfg.dtype);
		rc = rmoe_ctx_copy(ctx, x, where, stage, RMOE_MEMORY_HOST, bytes);
		rmoe_to_dtype(prob.dy, stage, n, cfg.dtype);
		rc = rmoe_app_agree(rc || rmoe_ctx_copy(ctx, dy, where, stage, RMOE_MEMORY_HOST, bytes));
	}
	/* Twice each: the second call reuses what the first left. */
	for (int it = 0; it < 2 && !rc; it++) {
		rc = rmoe_app_agree(rmoe_layer_forward(layer, prob.x, ref.y));
		if (!rc)
			rc = rmoe_app_agree(rmoe_layer_backward(layer, prob.dy, ref.dx));
		if (!rc && it == 1)
			rc = rmoe_app_agree(rmoe_results_collect(&ref, &prob, layer));
		if (!rc)
			rc = rmoe_app_agree(rmoe_layer_forward_raw(layer, where, x, y));
		if (!rc)
			rc = rmoe_app_agree(rmoe_layer_backward_raw(layer, where, dy, NULL, dx));
	}
	if (!rc)
		rc = rmoe_app_agree(rmoe_results_collect(&raw, &prob, layer));
	const void *outs[] = {y, dx};
	float *into[] = {raw.y, raw.dx};
	for (int i = 0; i < 2 && !rc; i++)
		if (!(rc = rmoe_app_agree(rmoe_ctx_copy(ctx, stage, RMOE_MEMORY_HOST, outs[i], where, bytes))))
			rmoe_from_dtype(stage, into[i], n, cfg.dtype);
	const char *name = rmoe_dispatch_name(cfg.dispatch), *dt = cfg.dtype == RMOE_DTYPE_BF16 ? "bf16" : "f32";
	snprintf(what, sizeof(what), "%s %s: layer calls (%s)", name, dt, rc ? rmoe_strerror(rc) : "ok");
	expect(!rc, what);
	if (!rc) {
		const int64_t HF = cfg.hidden * cfg.ffn * prob.e_local;
		int diff = same(ref.y, raw.y, n) || same(ref.dx, raw.dx, n) || same(ref.dw_gate, raw.dw_gate, HF) ||
		           same(ref.dw_down, raw.dw_down, HF) ||
		           same(ref.dw_router, raw.dw_router, cfg.hidden * cfg.experts) ||
		           same(ref.dws_up, raw.dws_up, cfg.hidden * cfg.shared_ffn);
		snprintf(what, sizeof(what), "%s %s: _raw outputs differ from the float32 calls'", name, dt);
		expect(!diff, what);
		rmoe_app_say("  %-5s %-4s raw = float32 calls: %s\n", name, dt, diff ? "NO" : "bit for bit");
	}
	void *bufs[] = {x, dy, y, dx};
	for (int i = 0; i < 4; i++)
		rmoe_ctx_free(ctx, where, bufs[i], bytes);
	free(stage);
	rmoe_results_free(&ref);
	rmoe_results_free(&raw);
	rmoe_layer_destroy(layer);
	rmoe_problem_free(&prob);
}

/* Bad arguments: one code on every rank, and the layer usable after. */
static void bad_arguments(rmoe_ctx *ctx, struct rmoe_layer_config cfg, int have_device)
{
	rmoe_layer *layer = NULL;
	if (rmoe_app_agree(rmoe_layer_create(&layer, ctx, &cfg))) {
		expect(0, "layer for the bad arguments");
		return;
	}
	float buf[1];
	void *p = NULL;
	int rank = rmoe_ctx_rank(ctx);
	expect(rmoe_layer_forward_raw(layer, (enum rmoe_memory)7, buf, buf) == RMOE_EINVAL, "where = 7 -> EINVAL");
	expect(rmoe_layer_forward_raw(layer, RMOE_MEMORY_HOST, NULL, buf) == RMOE_EINVAL, "NULL x -> EINVAL");
	/* one rank's bad pointer fails every rank */
	expect(rmoe_layer_backward_raw(layer, RMOE_MEMORY_HOST, rank == 0 ? NULL : buf, NULL, buf) != 0,
	       "backward before forward or NULL dy on rank 0 -> an error on every rank");
	expect(rmoe_ctx_alloc(ctx, RMOE_MEMORY_HOST, 0, &p) == RMOE_EINVAL && !p, "alloc of 0 bytes -> EINVAL");
	if (!have_device) {
		expect(rmoe_layer_forward_raw(layer, RMOE_MEMORY_DEVICE, buf, buf) == RMOE_ENOTSUP,
		       "device buffers without a CUDA worker -> ENOTSUP");
		expect(rmoe_ctx_alloc(ctx, RMOE_MEMORY_DEVICE, 64, &p) == RMOE_ENOTSUP, "device alloc -> ENOTSUP");
		rmoe_app_say("  without a CUDA worker: %s\n", rmoe_strerror(RMOE_ENOTSUP));
	}
	rmoe_layer_destroy(layer);
}

int main(int argc, char **argv)
{
	int nranks;
	/* Never NULL: a context that cannot be made fails the test there. */
	rmoe_ctx *ctx = rmoe_test_start(&argc, &argv, &nranks);
	void *probe = NULL;
	int have_device = rmoe_ctx_alloc(ctx, RMOE_MEMORY_DEVICE, 64, &probe) == 0;
	if (probe)
		rmoe_ctx_free(ctx, RMOE_MEMORY_DEVICE, probe, 64);
	int want_device = argc > 1 && !strcmp(argv[1], "device");
	if (want_device && !have_device) {
		rmoe_app_say("test_raw device: no CUDA worker: skipped\n");
		rmoe_ctx_destroy(ctx);
		MPI_Finalize();
		return RMOE_TEST_SKIPPED;
	}
	enum rmoe_memory where = want_device ? RMOE_MEMORY_DEVICE : RMOE_MEMORY_HOST;
	rmoe_app_say("test_raw on %d rank(s), buffers on the %s\n", nranks, want_device ? "device" : "host");
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 24, 16, 4 * nranks, 3, 37);
	cfg.shared_ffn = 8;
	cfg.deterministic = 1;
	const enum rmoe_dispatch ds[] = {RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_RING_TOKEN, RMOE_DISPATCH_ALLTOALL};
	for (int t = 0; t < 2; t++)
		for (int i = 0; i < 3; i++) {
			cfg.dtype = t ? RMOE_DTYPE_BF16 : RMOE_DTYPE_F32;
			cfg.dispatch = ds[i];
			compare(ctx, cfg, where);
		}
	cfg.dispatch = RMOE_DISPATCH_RING_EXPERT;
	bad_arguments(ctx, cfg, have_device);
	return rmoe_test_end(ctx, "test_raw", failures);
}
