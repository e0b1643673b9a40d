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
 * alltoall_bwd.c), and Megatron-LM's (alltoall_megatron.c, its forward in
 * rmoe_alltoall.h). */
int rmoe_alltoall_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_alltoall_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                           starpu_data_handle_t dx);
int rmoe_alltoall_megatron_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                                    starpu_data_handle_t dx);
/* DeepEP's normal-mode dispatch: a token once per destination rank
 * (alltoall_deepep.c). */
int rmoe_alltoall_deepep_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_alltoall_deepep_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                                  starpu_data_handle_t dx);

#endif /* RMOE_DISPATCH_H */
