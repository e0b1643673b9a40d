/* The StarPU vector handles a pass registers (buffers.c): temporaries that
 * StarPU allocates and frees, and host or device buffers of the
 * application's. Private to graph/. */
#ifndef RMOE_BUFFERS_H
#define RMOE_BUFFERS_H

#include <starpu.h>
#include <stdint.h>

#include "rmoe_layer_impl.h"
#include "rmoe_pass.h"

/* A temporary vector handle of n elements of elsize bytes, allocated by
 * StarPU when its first task runs and freed after unregister_submit once its
 * last task ends. Tracks the largest one in pass. */
starpu_data_handle_t rmoe_temp_vector(struct rmoe_pass *pass, int64_t n, size_t elsize);

/* A temporary of n activations or weights (the layer's element type). */
static inline starpu_data_handle_t rmoe_act_vector(struct rmoe_pass *pass, const struct rmoe_layer *L, int64_t n)
{
	return rmoe_temp_vector(pass, n, L->act);
}

/* A temporary of n elements of elsize bytes in host memory the pass owns
 * (freed at its end, after the handle, which the caller must hold,
 * rmoe_pass_hold): for a buffer cut in pieces (stripes.c), which StarPU 1.3
 * gathers correctly only with a home node. Counted as the pass's resident
 * bytes. NULL when out of memory. */
starpu_data_handle_t rmoe_pass_host_temp(struct rmoe_pass *pass, int64_t n, size_t elsize);

/* A buffer a ring sends on (a slot, a padded partition): a temporary, or
 * where the layer's hops are striped a host temporary of the pass's
 * (rmoe_pass_host_temp, which the caller must then hold). NULL when out
 * of memory. */
static inline starpu_data_handle_t rmoe_ring_buffer(struct rmoe_pass *pass, const struct rmoe_layer *L, int64_t n,
                                                    size_t elsize)
{
	return L->striped ? rmoe_pass_host_temp(pass, n, elsize) : rmoe_temp_vector(pass, n, elsize);
}

/* A host buffer registered (home node: main memory); with pass, counted as
 * the pass's resident bytes. */
starpu_data_handle_t rmoe_host_vector(struct rmoe_pass *pass, void *ptr, int64_t n, size_t elsize);
/* The same on memory node node (an application's buffer on its device);
 * only main memory counts into pass->resident. */
starpu_data_handle_t rmoe_node_vector(struct rmoe_pass *pass, int node, void *ptr, int64_t n, size_t elsize);

#endif /* RMOE_BUFFERS_H */
