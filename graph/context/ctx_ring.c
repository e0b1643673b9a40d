/* The ring a context plans on the topology its ranks gathered. */
#include <stdio.h>
#include <string.h>

#include "rmoe_collective.h"
#include "rmoe_ctx.h"
#include "rmoe_system.h"

int rmoe_ctx_plan_ring(rmoe_ctx *ctx, struct rmoe_wait *w, const struct rmoe_ctx_config *cfg)
{
	struct rmoe_cluster cluster;
	memset(&cluster, 0, sizeof(cluster));
	int rc = cfg->cluster_file ? rmoe_cluster_load(cfg->cluster_file, &cluster) : 0;
	if (!rc && cfg->ring_order != RMOE_RING_PLANNED && cfg->ring_order != RMOE_RING_RANK)
		rc = rmoe_error(RMOE_EINVAL, "ctx ring_order = %d: expected RMOE_RING_PLANNED (0) or RMOE_RING_RANK (1)",
		                cfg->ring_order);
	/* Every layer plans on the context's topology with the same request
	 * (layer.c), so its ring is this one. */
	ctx->ring_rank_order = cfg->ring_order == RMOE_RING_RANK;
	/* Discovery is collective: all ranks enter it, or none. */
	if ((rc = rmoe_agree(w, ctx->comm, rc, "to read the cluster description"))) {
		rmoe_cluster_free(&cluster);
		return rc;
	}
	rc = rmoe_discover_topology(ctx, w, cfg->cluster_file ? &cluster : NULL, cfg->ranks_per_node, &ctx->topo);
	rmoe_cluster_free(&cluster);
	struct rmoe_plan plan;
	memset(&plan, 0, sizeof(plan));
	struct rmoe_plan_request ring_only = {.rank_order = ctx->ring_rank_order};
	if (!rc)
		rc = rmoe_plan_make(&ring_only, &ctx->topo, &plan);
	if (!rc) {
		ctx->ring = plan.order;
		plan.order = NULL;
	}
	rmoe_plan_free(&plan);
	if (!rc && ctx->verbose && ctx->rank == 0) {
		fprintf(stderr, "relaymoe: %s ring over %d node(s) (%s):", ctx->ring_rank_order ? "rank-order" : "planned",
		        ctx->topo.nnodes, ctx->topo.placement);
		for (int i = 0; i < ctx->size; i++)
			fprintf(stderr, " %d", ctx->ring[i]);
		fprintf(stderr, "\n");
	}
	if ((rc = rmoe_agree(w, ctx->comm, rc, "to plan the ring")))
		return rc;
	/* Ranks that read different cluster descriptions would plan different
	 * rings and wait on each other forever. */
	uint64_t h = rmoe_hash_init();
	for (int i = 0; i < ctx->size; i++)
		h = rmoe_hash_i64(h, ctx->ring[i]);
	int same = rmoe_agree_digest(w, ctx->comm, h, "comparing ring orders");
	if (same < 0)
		return same;
	if (!same)
		return rmoe_error(RMOE_EMISMATCH, "the ranks planned different ring orders: give every rank the same "
		                                  "cluster description and ring_order");
	return 0;
}
