/* The context plans its ring from a cluster description.
 *   test_ring_plan FILE             FILE places 4 ranks on 2 nodes, interleaved
 *                                   (0, 2 on one; 1, 3 on the other): the ring
 *                                   crosses between nodes once per node, every
 *                                   rank has the same order, and the ring
 *                                   dispatchers on that order agree with
 *                                   all-to-all
 *   test_ring_plan --missing-on R FILE
 *                                   rank R cannot read its description: every
 *                                   rank fails context creation, none hangs */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "messages.h"
#include "problem.h"
#include "results.h"

/* Ring and all-to-all sum the same products in another order. */
#define AGREEMENT_TOLERANCE 1e-5

static int failures;

static void expect(int ok, const char *what)
{
	rmoe_app_say("  %-66s %s\n", what, ok ? "ok" : "FAIL");
	if (!ok)
		failures++;
}

static int run(rmoe_ctx *ctx, struct rmoe_layer_config cfg, const struct rmoe_problem *prob,
               struct rmoe_results *res)
{
	int rc = rmoe_problem_run(ctx, &cfg, prob, res, NULL);
	if (rc)
		rmoe_app_error("%s: %s", rmoe_dispatch_name(cfg.dispatch), rmoe_strerror(rc));
	return rc;
}

static int missing_on(int victim, const char *file)
{
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	struct rmoe_ctx_config cfg;
	rmoe_ctx_config_init(&cfg);
	cfg.cluster_file = rank == victim ? "/nonexistent/relaymoe-test.cluster" : file;
	rmoe_ctx *ctx = NULL;
	int rc = rmoe_ctx_create(&ctx, &cfg);
	const char *msg = rmoe_strerror(rc);
	int ok = rc != 0 && !ctx &&
	         (rank == victim ? rc == RMOE_EIO && strstr(msg, "/nonexistent/relaymoe-test.cluster") != NULL
	                         : strstr(msg, "another rank") != NULL);
	printf("rank %d: %s (%s)\n", rank, ok ? "failed as expected" : "FAILED", rc ? msg : "no error");
	if (ctx)
		rmoe_ctx_destroy(ctx);
	int all = 0;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	return all ? 0 : 1;
}

int main(int argc, char **argv)
{
	int provided, nranks, rank;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (argc == 4 && strcmp(argv[1], "--missing-on") == 0) {
		int code = missing_on(atoi(argv[2]), argv[3]);
		MPI_Finalize();
		return code;
	}
	if (argc != 2 || nranks != 4) {
		/* The description places exactly four ranks. */
		rmoe_app_say("test_ring_plan: needs 4 ranks and a cluster file\n");
		MPI_Finalize();
		return RMOE_TEST_SKIPPED;
	}
	const int node_of[4] = {0, 1, 0, 1};   /* as the description places them */

	struct rmoe_ctx_config ccfg;
	rmoe_ctx_config_init(&ccfg);
	ccfg.cluster_file = argv[1];
	ccfg.verbose = 1;
	rmoe_ctx *ctx = NULL;
	int rc = rmoe_app_agree(rmoe_ctx_create(&ctx, &ccfg));
	if (rc) {
		rmoe_app_error("%s", rmoe_strerror(rc));
		MPI_Finalize();
		return 1;
	}
	int order[4], all[16];
	rmoe_ctx_ring_order(ctx, order);
	MPI_Allgather(order, 4, MPI_INT, all, 4, MPI_INT, MPI_COMM_WORLD);
	rmoe_app_say("test_ring_plan: ring order %d %d %d %d\n", order[0], order[1], order[2], order[3]);

	int same = 1, perm = 1, seen[4] = {0}, crossings = 0;
	for (int r = 1; r < 4; r++)
		same = same && memcmp(all, all + 4 * r, sizeof(order)) == 0;
	for (int i = 0; i < 4; i++) {
		perm = perm && order[i] >= 0 && order[i] < 4 && !seen[order[i]];
		if (order[i] >= 0 && order[i] < 4)
			seen[order[i]] = 1;
	}
	for (int i = 0; i < 4 && perm; i++)
		crossings += node_of[order[i]] != node_of[order[(i + 1) % 4]];
	expect(same, "every rank has the same ring order");
	expect(perm, "the order is a permutation of the ranks");
	expect(crossings == 2, "the ring crosses between the 2 nodes once per node");

	/* The layer on this non-identity ring: both ring dispatchers against
	 * all-to-all, which does not use the ring. */
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 24, 12, 8, 3, 40);
	struct rmoe_problem prob;
	rc = rmoe_app_agree(rmoe_problem_init(&prob, &cfg, 5, NULL));
	struct rmoe_results res[3];
	memset(res, 0, sizeof(res));
	const enum rmoe_dispatch which[3] = {RMOE_DISPATCH_ALLTOALL, RMOE_DISPATCH_RING_EXPERT,
	                                     RMOE_DISPATCH_RING_TOKEN};
	for (int i = 0; i < 3 && !rc; i++) {
		cfg.dispatch = which[i];
		rc = run(ctx, cfg, &prob, &res[i]);
	}
	expect(rc == 0, "a2a, ring and token routing run on the planned ring");
	for (int i = 1; i < 3 && !rc; i++) {
		const char *worst = "";
		double d = rmoe_results_max_rel_diff(&res[i], &res[0], &prob, &worst);
		char what[128];
		snprintf(what, sizeof(what), "%s vs a2a: largest relative difference %.1e (%s) <= %.0e",
		         rmoe_dispatch_name(which[i]), d, worst, AGREEMENT_TOLERANCE);
		expect(d <= AGREEMENT_TOLERANCE, what);
	}
	for (int i = 0; i < 3; i++)
		rmoe_results_free(&res[i]);
	rmoe_problem_free(&prob);
	return rmoe_test_end(ctx, "test_ring_plan", failures);
}
