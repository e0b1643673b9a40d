/* The plan of a layer on a topology: ring order, its edges, the routing
 * choice. The memory part is left for the memory model. */
#include <stdlib.h>
#include <string.h>

#include "rmoe_plan.h"

int rmoe_plan_make(const struct rmoe_topology *t, const struct rmoe_routing_problem *p, struct rmoe_plan *out)
{
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_plan_make: out is NULL");
	memset(out, 0, sizeof(*out));
	if (!t || !p || t->nranks < 1)
		return rmoe_error(RMOE_EINVAL, "rmoe_plan_make: expected a topology and a routing problem");
	if (p->ep != t->nranks)
		return rmoe_error(RMOE_EINVAL, "EP = %lld but the topology has %d ranks: expected the same",
		                  (long long)p->ep, t->nranks);
	out->nranks = t->nranks;
	out->order = malloc(sizeof(int) * (size_t)t->nranks);
	out->edges = malloc(sizeof(*out->edges) * (size_t)t->nranks);
	int rc = out->order && out->edges ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory for the plan");
	if (!rc)
		rc = rmoe_ring_order(t, out->order);
	if (!rc)
		rc = rmoe_ring_edges(t, out->order, out->edges);
	if (!rc) {
		out->node_crossings = rmoe_ring_node_crossings(t, out->order);
		double tflops = p->dtype == RMOE_DTYPE_BF16 ? t->bf16_tflops : t->f32_tflops;
		rc = rmoe_routing_choose(p, out->edges, t->nranks, tflops, &out->routing);
	}
	out->memory.modelled = 0;
	if (rc)
		rmoe_plan_free(out);
	return rc;
}

void rmoe_plan_free(struct rmoe_plan *plan)
{
	if (!plan)
		return;
	free(plan->order);
	free(plan->edges);
	plan->order = NULL;
	plan->edges = NULL;
	plan->nranks = 0;
}
