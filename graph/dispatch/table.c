/* Each dispatcher's graph, a row each: the other half of its row in
 * scheduler/dispatchers.c. A pass calls its dispatcher through the row
 * (forward_backward.c); nothing else in graph/ tests which one runs. */
#include "rmoe_alltoall.h"
#include "rmoe_dispatch.h"

static const struct rmoe_dispatch_ops ops[] = {
	{RMOE_DISPATCH_RING_EXPERT, rmoe_ring_expert_forward, rmoe_ring_expert_backward, NULL},
	{RMOE_DISPATCH_RING_TOKEN, rmoe_ring_token_forward, rmoe_ring_token_backward, NULL},
	{RMOE_DISPATCH_ALLTOALL, rmoe_alltoall_forward, rmoe_alltoall_backward, rmoe_a2a_tags},
	{RMOE_DISPATCH_ALLTOALL_MEGATRON, rmoe_alltoall_megatron_forward, rmoe_alltoall_megatron_backward, NULL},
	{RMOE_DISPATCH_ALLTOALL_DEEPEP, rmoe_alltoall_deepep_forward, rmoe_alltoall_deepep_backward, rmoe_a2a_tags},
};

const struct rmoe_dispatch_ops *rmoe_dispatch_ops_of(enum rmoe_dispatch d)
{
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (ops[i].kind == d)
			return &ops[i];
	return NULL;
}
