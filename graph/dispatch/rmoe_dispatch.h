/* The dispatch graphs of one layer pass (§3.1-§3.2 and the baseline).
 * Each is called after the router and dispatch map of the pass are
 * submitted and the expert counts are known on the host; it submits every
 * task and transfer of the dispatch and returns; the caller waits. With
 * them, the helpers they are built with. Private to graph/. */
#ifndef RMOE_DISPATCH_H
#define RMOE_DISPATCH_H

#include "rmoe_buffers.h"
#include "rmoe_chunks.h"
#include "rmoe_codelets.h"
#include "rmoe_collective.h"
#include "rmoe_pass.h"
#include "rmoe_scheduler.h"
#include "rmoe_tasks.h"
#include "rmoe_transfers.h"

int rmoe_ring_expert_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_ring_expert_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                              starpu_data_handle_t dx);
int rmoe_ring_token_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_ring_token_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                             starpu_data_handle_t dx);
/* The lean all-to-all, pipelined per peer and chunk (alltoall_fwd.c,
 * alltoall_bwd.c), and Megatron-LM's (alltoall_megatron.c). */
int rmoe_alltoall_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_alltoall_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                           starpu_data_handle_t dx);
int rmoe_alltoall_megatron_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_alltoall_megatron_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                                    starpu_data_handle_t dx);
/* DeepEP's normal-mode dispatch: a token once per destination rank
 * (alltoall_deepep.c). */
int rmoe_alltoall_deepep_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_alltoall_deepep_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                                  starpu_data_handle_t dx);

/* A dispatcher's graph, the other half of its row in scheduler/'s table
 * (rmoe_dispatchers.h): what a pass calls, in table.c. */
struct rmoe_dispatch_ops {
	enum rmoe_dispatch kind;
	int (*forward)(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
	int (*backward)(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy, starpu_data_handle_t dx);
	/* The MPI tags a pass needs, where more than a ring's RMOE_PASS_TAGS(N)
	 * may be; NULL: those. */
	int64_t (*tags)(const struct rmoe_layer *L);
};

/* The graph of d (a dispatch that runs: never auto, which the plan
 * resolves), or NULL. */
const struct rmoe_dispatch_ops *rmoe_dispatch_ops_of(enum rmoe_dispatch d);

#endif /* RMOE_DISPATCH_H */
