/* A task that fails inside a pass fails the layer call on every rank.
 *
 * Run with RMOE_FAULT_TASK=router-bwd@1 (tests/mpi/CMakeLists.txt): on rank
 * 1 the router's backward task sees its first buffer one element short, so
 * its own size check fails as a mis-sized task would. For every dispatcher:
 * the forward succeeds; the backward returns RMOE_ESTARPU on every rank,
 * naming the task and the rank it failed on, within the wait timeout (no
 * hang); the next forward on the same layer succeeds again (the status
 * is the pass's, cleared as the next one begins). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "messages.h"
#include "problem.h"

static int failures;

static void expect(int ok, const char *dispatch, const char *what)
{
	if (!ok) {
		rmoe_app_error("FAIL %s: %s\n", dispatch, what);
		failures++;
	}
}

/* 1 on every rank when cond holds on every rank. */
static int everywhere(int cond)
{
	int all = cond;
	MPI_Allreduce(&cond, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	return all;
}

static void one_dispatch(rmoe_ctx *ctx, enum rmoe_dispatch d, int nranks)
{
	const char *name = rmoe_dispatch_name(d);
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 32, 16, 4 * nranks, 2, 48);
	cfg.dispatch = d;
	cfg.wait_timeout = 60; /* a hang fails with RMOE_EPEER instead of blocking */
	struct rmoe_problem p;
	if (rmoe_problem_init(&p, &cfg, 4242, NULL)) {
		failures++;
		return;
	}
	rmoe_layer *layer = NULL;
	int rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, &cfg));
	if (!rc)
		rc = rmoe_app_agree(rmoe_problem_apply(&p, layer));
	const size_t n = (size_t)(cfg.tokens * cfg.hidden);
	float *y = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float));
	expect(!rc && y && dx, name, "layer set-up");
	if (!rc && y && dx) {
		expect(everywhere(rmoe_layer_forward(layer, p.x, y) == 0), name, "the forward succeeds");
		rc = rmoe_layer_backward(layer, p.dy, dx);
		const char *msg = rmoe_strerror(rc);
		expect(everywhere(rc == RMOE_ESTARPU), name, "the backward returns RMOE_ESTARPU on every rank");
		expect(everywhere(strstr(msg, "task router-bwd failed") != NULL), name, "the message names the task");
		expect(everywhere(strstr(msg, "rank 1:") != NULL), name, "the message names the rank it failed on");
		expect(everywhere(strstr(msg, "buffer 0") != NULL), name, "the message says what did not match");
		expect(everywhere(rmoe_layer_forward(layer, p.x, y) == 0), name,
		       "the next forward succeeds: the failure was the pass's");
		if (rc != RMOE_ESTARPU)
			rmoe_app_error("%s: backward returned %d: %s\n", name, rc, msg);
	}
	free(y);
	free(dx);
	rmoe_layer_destroy(layer);
	rmoe_problem_free(&p);
}

int main(int argc, char **argv)
{
	const char *fault = getenv("RMOE_FAULT_TASK");
	if (!fault || strcmp(fault, "router-bwd@1") != 0) {
		fprintf(stderr, "test_task_errors: run with RMOE_FAULT_TASK=router-bwd@1\n");
		return 1;
	}
	int nranks;
	/* Never NULL: a context that cannot be made fails the test there. */
	rmoe_ctx *ctx = rmoe_test_start(&argc, &argv, &nranks);
	if (nranks < 2) {
		rmoe_app_say("test_task_errors: needs 2 or more ranks (the fault is on rank 1)\n");
		return rmoe_test_end(ctx, "test_task_errors", 1);
	}
	const enum rmoe_dispatch all[] = {RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_RING_TOKEN, RMOE_DISPATCH_ALLTOALL,
	                                  RMOE_DISPATCH_ALLTOALL_MEGATRON, RMOE_DISPATCH_ALLTOALL_DEEPEP};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		one_dispatch(ctx, all[i], nranks);
	return rmoe_test_end(ctx, "test_task_errors", failures);
}
