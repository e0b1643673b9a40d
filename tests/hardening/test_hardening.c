/* The library against bad input, disagreeing ranks and failures, through the
 * public API on several ranks. Each mode is one CTest (tests/CMakeLists.txt)
 * and one or more rows of docs/hardening.md:
 *   mismatch   ranks pass different configurations
 *   ranks      a configuration the rank count cannot use
 *   args       one rank passes a NULL buffer, or calls backward first
 *   nonfinite  NaN and infinity in weights, x, dy
 *   nomem      a layer larger than the memory this rank may use
 *   alloc      host allocations failing (run under failmalloc.so)
 *   starved    StarPU unable to allocate a pass's temporaries (failmalloc.so)
 *   kill       one rank dies mid-pass; the others must give up (wait_timeout);
 *              arguments: timeout, delay before the death, dispatch (auto)
 * Every expected error must come back on every rank, with a message naming
 * the value, and no rank may hang. */
#define _GNU_SOURCE
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "problem.h"
#include "relaymoe/relaymoe.h"
#include "rmoe_scheduler.h"
#include "rmoe_system.h"

#define MSG 512

static double now(void);

static int rank, size, failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "rank %d: FAIL: ", rank);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	failures++;
}

/* rc is code on every rank, every message names needle, and (same) every
 * rank has the same message. Reported once, by rank 0. */
static void expect_all(const char *name, int rc, int code, const char *needle, int same)
{
	char mine[MSG];
	snprintf(mine, sizeof(mine), "%s", rc ? rmoe_strerror(rc) : "(success)");
	int ok = rc == code && strstr(mine, needle) != NULL;
	if (!ok)
		fail("%s: code %d (wanted %d), message \"%s\" (wanted \"%s\")", name, rc, code, mine, needle);
	char *all = rank == 0 ? malloc((size_t)size * MSG) : NULL;
	MPI_Gather(mine, MSG, MPI_CHAR, all, MSG, MPI_CHAR, 0, MPI_COMM_WORLD);
	int all_ok = ok;
	MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (rank == 0) {
		int alike = 1;
		for (int r = 1; r < size && same; r++)
			alike = alike && strcmp(all, all + (size_t)r * MSG) == 0;
		if (!alike) {
			fail("%s: the ranks' messages differ", name);
			for (int r = 0; r < size; r++)
				fprintf(stderr, "  rank %d: %s\n", r, all + (size_t)r * MSG);
		}
		if (all_ok && alike)
			printf("ok: %s: every rank: %s\n", name, mine);
		fflush(stdout);
		free(all);
	}
}

/* The small layer most cases use. */
static void layer_config(struct rmoe_layer_config *cfg)
{
	rmoe_app_layer_shape(cfg, 16, 8, 2 * size, 2, 12);
}

/* Seeded values in [-0.5, 0.5), never zeros. */
static void fill(float *v, int64_t n, unsigned seed)
{
	uint64_t s = 0x9E3779B97F4A7C15ull * (seed + 1);
	for (int64_t i = 0; i < n; i++) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		v[i] = (float)((s >> 11) * 0x1.0p-53) - 0.5f;
	}
}

struct tensors {
	float *x, *y, *dy, *dx, *router, *gate, *up, *down;
};

static void tensors_alloc(struct tensors *t, const struct rmoe_layer_config *c)
{
	const int64_t th = c->tokens * c->hidden, hf = c->hidden * c->ffn;
	t->x = malloc(sizeof(float) * (size_t)th);
	t->y = malloc(sizeof(float) * (size_t)th);
	t->dy = malloc(sizeof(float) * (size_t)th);
	t->dx = malloc(sizeof(float) * (size_t)th);
	t->router = malloc(sizeof(float) * (size_t)(c->hidden * c->experts));
	t->gate = malloc(sizeof(float) * (size_t)hf);
	t->up = malloc(sizeof(float) * (size_t)hf);
	t->down = malloc(sizeof(float) * (size_t)hf);
	fill(t->x, th, 1 + (unsigned)rank);
	fill(t->dy, th, 100 + (unsigned)rank);
	fill(t->router, c->hidden * c->experts, 200);
	fill(t->gate, hf, 300);
	fill(t->up, hf, 400);
	fill(t->down, hf, 500);
}

static void tensors_free(struct tensors *t)
{
	free(t->x);
	free(t->y);
	free(t->dy);
	free(t->dx);
	free(t->router);
	free(t->gate);
	free(t->up);
	free(t->down);
}

static int set_weights(rmoe_layer *layer, const struct tensors *t)
{
	int rc = rmoe_layer_set_router(layer, t->router);
	int64_t first, count;
	rmoe_layer_owned_experts(layer, &first, &count);
	for (int64_t e = first; e < first + count && !rc; e++)
		rc = rmoe_layer_set_expert(layer, e, t->gate, t->up, t->down);
	return rc;
}

/* ---- modes ------------------------------------------------------------------ */

/* A layer of cfg with seeded tensors and its weights set; NULL (reported)
 * when it cannot be created. */
static rmoe_layer *ready_layer(rmoe_ctx *ctx, const struct rmoe_layer_config *cfg, struct tensors *t)
{
	rmoe_layer *layer = NULL;
	int rc = rmoe_layer_create(&layer, ctx, cfg);
	if (rc) {
		fail("layer creation: %s", rmoe_strerror(rc));
		return NULL;
	}
	tensors_alloc(t, cfg);
	set_weights(layer, t);
	return layer;
}

/* The small layer most cases use, ready as above. */
static rmoe_layer *small_layer(rmoe_ctx *ctx, struct rmoe_layer_config *cfg, struct tensors *t)
{
	layer_config(cfg);
	return ready_layer(ctx, cfg, t);
}

/* mode on the small layer, destroyed after. */
static void with_small_layer(rmoe_ctx *ctx,
                             void (*mode)(rmoe_layer *, const struct rmoe_layer_config *, struct tensors *))
{
	struct rmoe_layer_config cfg;
	struct tensors t;
	rmoe_layer *layer = small_layer(ctx, &cfg, &t);
	if (!layer)
		return;
	mode(layer, &cfg, &t);
	rmoe_layer_destroy(layer);
	tensors_free(&t);
}

static void mode_mismatch(rmoe_ctx *ctx)
{
	struct rmoe_layer_config cfg;
	rmoe_layer *layer = NULL;
	layer_config(&cfg);
	if (rank == size - 1)
		cfg.tokens += 1;
	char needle[96];
	snprintf(needle, sizeof(needle), "tokens = 12 on rank 0 but 13 on rank %d", size - 1);
	expect_all("tokens differ between ranks", rmoe_layer_create(&layer, ctx, &cfg), RMOE_EMISMATCH,
	           needle, 1);
	layer_config(&cfg);
	if (rank == 0)
		cfg.dispatch = RMOE_DISPATCH_ALLTOALL;
	expect_all("dispatch differs between ranks", rmoe_layer_create(&layer, ctx, &cfg), RMOE_EMISMATCH,
	           "dispatch = 0 on rank 0 but 1 on rank 1", 1);
	layer_config(&cfg);
	cfg.check_finite = rank == 0;
	expect_all("check_finite differs between ranks", rmoe_layer_create(&layer, ctx, &cfg),
	           RMOE_EMISMATCH, "check_finite = 1 on rank 0 but 0 on rank 1", 1);
	/* A value only one rank gets wrong: every rank refuses it. */
	layer_config(&cfg);
	if (rank == size - 1)
		cfg.topk = cfg.experts + 1;
	snprintf(needle, sizeof(needle), "rank %d: topk = %d is larger than experts = %d", size - 1,
	         2 * size + 1, 2 * size);
	expect_all("topk > experts on one rank", rmoe_layer_create(&layer, ctx, &cfg), RMOE_EINVAL,
	           needle, 1);
	if (layer)
		fail("a layer was created although creation failed");
}

static void mode_ranks(rmoe_ctx *ctx)
{
	struct rmoe_layer_config cfg;
	rmoe_layer *layer = NULL;
	char needle[64];
	layer_config(&cfg);
	cfg.experts = 2 * size + 1;
	snprintf(needle, sizeof(needle), "not divisible by the %d ranks", size);
	expect_all("experts not divisible by the rank count", rmoe_layer_create(&layer, ctx, &cfg),
	           RMOE_EINVAL, needle, 1);
	layer_config(&cfg);
	cfg.experts = size - 1 > 0 ? size - 1 : 1;
	cfg.topk = 1;
	if (size > 1)
		expect_all("fewer experts than ranks", rmoe_layer_create(&layer, ctx, &cfg), RMOE_EINVAL,
		           "experts = ", 1);
}

static void mode_args(rmoe_layer *layer, const struct rmoe_layer_config *c, struct tensors *tp)
{
	const struct rmoe_layer_config cfg = *c;
	struct tensors t = *tp;
	int rc;
	expect_all("backward before forward", rmoe_layer_backward(layer, t.dy, t.dx), RMOE_ESTATE,
	           "before any rmoe_layer_forward", 1);
	expect_all("NULL x on one rank", rmoe_layer_forward(layer, rank == size - 1 ? NULL : t.x, t.y),
	           RMOE_EINVAL, "x and y must not be NULL", 1);
	/* The refusal left nothing half-done: the layer still works. */
	rc = rmoe_layer_forward(layer, t.x, t.y);
	if (!rc)
		rc = rmoe_layer_backward(layer, t.dy, t.dx);
	expect_all("forward and backward after a refused call", rc, 0, "(success)", 1);
	expect_all("NULL dx on one rank", rmoe_layer_backward(layer, t.dy, rank == 0 ? NULL : t.dx),
	           RMOE_EINVAL, "dy and dx must not be NULL", 1);
	expect_all("expert not owned", rmoe_layer_set_expert(layer, cfg.experts + 5, t.gate, t.up, t.down),
	           RMOE_EINVAL, "not owned", 0);
	*tp = t;
}

static void mode_nonfinite(rmoe_ctx *ctx)
{
	struct rmoe_layer_config cfg;
	struct tensors t;
	rmoe_layer *layer = small_layer(ctx, &cfg, &t);
	if (!layer)
		return;
	int rc;
	expect_all("finite weights and inputs pass", rmoe_layer_check_finite(layer, t.x, t.dy), 0,
	           "(success)", 1);

	/* An infinity in the up projection of the last rank's first expert. */
	int64_t first, count;
	rmoe_layer_owned_experts(layer, &first, &count);
	char needle[96];
	snprintf(needle, sizeof(needle), "rank %d: w_up[%lld][3, 5] = inf", size - 1,
	         (long long)(2 * (size - 1)));
	if (rank == size - 1) {
		t.up[3 * cfg.ffn + 5] = INFINITY;
		rmoe_layer_set_expert(layer, first, t.gate, t.up, t.down);
		t.up[3 * cfg.ffn + 5] = 0.25f;
	}
	expect_all("infinity in an expert's weights", rmoe_layer_check_finite(layer, NULL, NULL),
	           RMOE_ENONFINITE, needle, 1);
	if (rank == size - 1)
		rmoe_layer_set_expert(layer, first, t.gate, t.up, t.down);

	/* NaN in the router (replicated: every rank holds it; rank 0 names it). */
	t.router[7 * cfg.experts + 1] = NAN;
	rmoe_layer_set_router(layer, t.router);
	expect_all("NaN in the router weights", rmoe_layer_check_finite(layer, NULL, NULL), RMOE_ENONFINITE,
	           "rank 0: w_router[7, 1] = nan", 1);
	t.router[7 * cfg.experts + 1] = 0.125f;
	rmoe_layer_set_router(layer, t.router);

	/* Inputs: through the explicit check, and through the layer's flag. */
	if (rank == 0)
		t.x[4 * cfg.hidden + 9] = NAN;
	expect_all("NaN in x (explicit check)", rmoe_layer_check_finite(layer, t.x, NULL), RMOE_ENONFINITE,
	           "rank 0: x[4, 9] = nan", 1);
	rmoe_layer_destroy(layer);

	cfg.check_finite = 1;
	rc = rmoe_layer_create(&layer, ctx, &cfg);
	if (rc) {
		fail("layer creation with check_finite: %s", rmoe_strerror(rc));
		tensors_free(&t);
		return;
	}
	set_weights(layer, &t);
	expect_all("NaN in x (check_finite forward)", rmoe_layer_forward(layer, t.x, t.y), RMOE_ENONFINITE,
	           "rank 0: x[4, 9] = nan", 1);
	t.x[4 * cfg.hidden + 9] = 0.5f;
	rc = rmoe_layer_forward(layer, t.x, t.y);
	expect_all("forward after the bad input is fixed", rc, 0, "(success)", 1);
	if (rank == size - 1)
		t.dy[11 * cfg.hidden + 0] = -INFINITY;
	char dy_needle[64];
	snprintf(dy_needle, sizeof(dy_needle), "rank %d: dy[11, 0] = -inf", size - 1);
	expect_all("infinity in dy (check_finite backward)", rmoe_layer_backward(layer, t.dy, t.dx),
	           RMOE_ENONFINITE, dy_needle, 1);
	rmoe_layer_destroy(layer);
	tensors_free(&t);
}

/* A layer whose buffers pass every 32-bit check but not this rank's memory:
 * the address-space limit is set to what the process holds plus 2 GiB, and
 * the layer wants about 34 GB per rank. */
static void mode_nomem(rmoe_ctx *ctx)
{
	struct rlimit rl;
	getrlimit(RLIMIT_AS, &rl);
	rlim_t cap = (rlim_t)rmoe_host_vm_bytes() + ((rlim_t)2 << 30);
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > cap) {
		rl.rlim_cur = cap;
		if (setrlimit(RLIMIT_AS, &rl) != 0)
			fail("setrlimit(RLIMIT_AS) failed");
	}
	struct rmoe_layer_config cfg;
	/* 3 x 32768 x 43690 = 4.29e9 elements: just under 2^32 */
	rmoe_app_layer_shape(&cfg, 32768, 43690, size, 1, 1);
	rmoe_layer *layer = NULL;
	expect_all("layer larger than the rank's memory", rmoe_layer_create(&layer, ctx, &cfg), RMOE_ENOMEM,
	           "the layer needs at least", 1);
	if (layer)
		fail("a layer was created");
}

/* Under failmalloc.so, which refuses requests above a size on one rank:
 * the failing rank names the allocation, the others that another rank
 * failed. */
static void mode_alloc(rmoe_ctx *ctx)
{
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 1024, 1024, 4 * size, 1, 64);
	rmoe_layer *layer = NULL;
	int rc = rmoe_layer_create(&layer, ctx, &cfg);
	char needle[64];
	const char *failing = getenv("RMOE_FAILMALLOC_RANK");
	snprintf(needle, sizeof(needle), "rank %s: out of host memory", failing ? failing : "1");
	expect_all("host allocation failure on one rank", rc, RMOE_ENOMEM, needle, 1);
	if (layer)
		fail("a layer was created");
}

/* Under failmalloc.so with a limit that the layer's own buffers pass but a
 * pass's temporaries do not: StarPU 1.3 cannot fail a task for want of
 * memory and retries forever; the layer's wait_timeout turns that into
 * RMOE_EPEER. The layer cannot be destroyed afterwards: the process ends. */
static void mode_starved(rmoe_ctx *ctx)
{
	struct rmoe_layer_config cfg;
	/* x: 8 MiB; a hop's gathered rows: 64 Ki x 256 floats = 64 MiB */
	rmoe_app_layer_shape(&cfg, 256, 16, 8 * size, 8, 8192);
	cfg.wait_timeout = 5;
	struct tensors t;
	rmoe_layer *layer = ready_layer(ctx, &cfg, &t);
	if (!layer)
		return;
	int rc;
	double t0 = now();
	rc = rmoe_layer_forward(layer, t.x, t.y);
	double took = now() - t0;
	if (rc == RMOE_EPEER && took < 30)
		printf("ok: StarPU cannot allocate a temporary: RMOE_EPEER after %.1f s: %s\n", took,
		       rmoe_strerror(rc));
	else
		fail("forward without memory for its temporaries: code %d after %.1f s (%s)", rc, took,
		     rmoe_strerror(rc));
	fflush(stdout);
	fflush(stderr);
	_exit(failures ? 1 : 0);
}

/* ---- one rank dies ---------------------------------------------------------------- */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *kill_later(void *arg)
{
	double delay = *(double *)arg;
	struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
	nanosleep(&ts, NULL);
	fprintf(stderr, "rank %d: dying (SIGKILL) in the middle of a pass\n", rank);
	fflush(stderr);
	raise(SIGKILL);
	return NULL;
}

/* The last rank kills itself while the ranks run passes in a loop; every
 * survivor must come back with RMOE_EPEER within its wait_timeout and then
 * ends itself (exit status 3), as an application should. */
static void mode_kill(rmoe_ctx *ctx, double timeout, double delay, const char *dispatch)
{
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 256, 128, 4 * size, 2, 512);
	cfg.wait_timeout = timeout;
	if (dispatch && rmoe_dispatch_parse(dispatch, &cfg.dispatch)) {
		fail("kill: unknown dispatch '%s'", dispatch);
		return;
	}
	struct tensors t;
	rmoe_layer *layer = ready_layer(ctx, &cfg, &t);
	if (!layer)
		return;
	int rc;
	MPI_Barrier(MPI_COMM_WORLD);
	pthread_t killer;
	if (rank == size - 1)
		pthread_create(&killer, NULL, kill_later, &delay);
	double t0 = now(), last = t0;
	long passes = 0;
	for (;;) {
		last = now();
		rc = rmoe_layer_forward(layer, t.x, t.y);
		if (!rc) {
			last = now();
			rc = rmoe_layer_backward(layer, t.dy, t.dx);
		}
		if (rc)
			break;
		passes++;
		if (now() - t0 > 120) {
			fprintf(stderr, "rank %d: FAIL: still running after 120 s\n", rank);
			_exit(1);
		}
	}
	double waited = now() - last;
	printf("rank %d: %s after %ld pass(es); the failing call took %.1f s (wait_timeout %.1f s): %s\n",
	       rank, rc == RMOE_EPEER ? "RMOE_EPEER" : "unexpected error", passes, waited, timeout,
	       rmoe_strerror(rc));
	fflush(stdout);
	/* The layer, the context and MPI can no longer be shut down cleanly. */
	_exit(rc == RMOE_EPEER && waited < timeout + 10 ? 3 : 1);
}

int main(int argc, char **argv)
{
	int provided;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const char *mode = argc > 1 ? argv[1] : "";
	rmoe_ctx *ctx = NULL;
	int rc = rmoe_ctx_create(&ctx, NULL);
	if (rc) {
		fprintf(stderr, "rank %d: context: %s\n", rank, rmoe_strerror(rc));
		MPI_Finalize();
		return 1;
	}
	if (!strcmp(mode, "mismatch"))
		mode_mismatch(ctx);
	else if (!strcmp(mode, "ranks"))
		mode_ranks(ctx);
	else if (!strcmp(mode, "args"))
		with_small_layer(ctx, mode_args);
	else if (!strcmp(mode, "nonfinite"))
		mode_nonfinite(ctx);
	else if (!strcmp(mode, "nomem"))
		mode_nomem(ctx);
	else if (!strcmp(mode, "alloc"))
		mode_alloc(ctx);
	else if (!strcmp(mode, "starved"))
		mode_starved(ctx);
	else if (!strcmp(mode, "kill"))
		mode_kill(ctx, argc > 2 ? atof(argv[2]) : 5.0, argc > 3 ? atof(argv[3]) : 1.0, argc > 4 ? argv[4] : NULL);
	else
		fail("unknown mode '%s': expected mismatch, ranks, args, nonfinite, nomem, alloc, starved or kill",
		     mode);
	int worst = failures;
	MPI_Allreduce(&failures, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	rmoe_ctx_destroy(ctx);
	MPI_Finalize();
	if (rank == 0)
		printf("test_hardening %s: %s\n", mode, worst ? "FAILED" : "passed");
	return worst ? 1 : 0;
}
