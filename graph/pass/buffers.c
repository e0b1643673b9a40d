/* The StarPU vector handles a pass registers: temporaries (home node -1,
 * allocated by StarPU for their first task) and the application's host or
 * device buffers. */
#include <stdint.h>
#include <stdlib.h>

#include "rmoe_buffers.h"
#include "rmoe_codelets.h"

/* StarPU 1.3 counts a vector's elements in a uint32_t. A count that does
 * not fit (an all-to-all's received rows under skewed routing reach
 * N * T * K) is never narrowed: the handle gets no elements, the tasks
 * that use it fail their size checks, and the pass's end reports the count
 * (pass->oversized, which pass_end in forward_backward.c turns into
 * RMOE_ENOTSUP naming it). */
static uint32_t vector_nx(struct rmoe_pass *pass, int64_t n)
{
	if (n >= 0 && (uint64_t)n <= UINT32_MAX)
		return (uint32_t)n;
	if (pass && !pass->oversized)
		pass->oversized = n;
	return 0;
}

starpu_data_handle_t rmoe_temp_vector(struct rmoe_pass *pass, int64_t n, size_t elsize)
{
	starpu_data_handle_t h;
	int64_t bytes = n * (int64_t)elsize;
	/* StarPU frees a temporary's main-memory buffer at once (the host
	 * cache, codelets/probe/host_cache.c, keeps it), but keeps a device's in a
	 * cache that serves only an allocation of the same size: with row
	 * counts that differ from partition to partition every temporary would
	 * stay allocated until the device is full. Sizes in classes of an
	 * eighth of an octave (at most 12.5% over) make the next partition
	 * reuse them; host-only runs keep exact sizes. */
	if (starpu_cuda_worker_get_count() > 0)
		starpu_vector_data_register_allocsize(&h, -1, 0, vector_nx(pass, n), elsize, (size_t)rmoe_size_class(bytes));
	else
		starpu_vector_data_register(&h, -1, 0, vector_nx(pass, n), elsize);
	rmoe_bookkeeping_count_handle();
	if (bytes > pass->largest_temporary)
		pass->largest_temporary = bytes;
	return h;
}

starpu_data_handle_t rmoe_node_vector(struct rmoe_pass *pass, int node, void *ptr, int64_t n, size_t elsize)
{
	if (pass && node == STARPU_MAIN_RAM)
		pass->resident += n * (int64_t)elsize;
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, node, (uintptr_t)ptr, vector_nx(pass, n), elsize);
	rmoe_bookkeeping_count_handle();
	return h;
}

starpu_data_handle_t rmoe_pass_host_temp(struct rmoe_pass *pass, int64_t n, size_t elsize)
{
	if (rmoe_pass_room(&pass->owned, &pass->capowned, pass->nowned, sizeof(*pass->owned), 8))
		return NULL;
	void *mem = malloc((size_t)(n > 0 ? n : 1) * elsize);
	if (!mem)
		return NULL;
	pass->owned[pass->nowned++] = mem;
	pass->owned_bytes += n * (int64_t)elsize;
	return rmoe_host_vector(pass, mem, n, elsize);
}

starpu_data_handle_t rmoe_host_vector(struct rmoe_pass *pass, void *ptr, int64_t n, size_t elsize)
{
	return rmoe_node_vector(pass, STARPU_MAIN_RAM, ptr, n, elsize);
}
