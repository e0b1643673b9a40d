/* Memory probe: the bytes StarPU holds on each memory node (main memory and
 * every device), sampled by every codelet on entry and by the sampler
 * thread (sampler.c) while a pass is measured, with a running maximum per node
 * (StarPU 1.3 keeps no peak). Each sample also samples the process heap
 * (heap.c), the figure independent of StarPU's accounting. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_cl_probe.h"
#include "rmoe_system.h"

#define RMOE_PROBE_NODES 16
static _Atomic int64_t peak_bytes[RMOE_PROBE_NODES];

static int nodes(void)
{
	unsigned n = starpu_memory_nodes_get_count();
	return n < RMOE_PROBE_NODES ? (int)n : RMOE_PROBE_NODES;
}

/* 1.3 has no starpu_memory_get_used. */
static int64_t used(unsigned node)
{
	starpu_ssize_t total = starpu_memory_get_total(node);
	starpu_ssize_t available = starpu_memory_get_available(node);
	if (total < 0 || available < 0 || available > total)
		return 0;
	return (int64_t)(total - available);
}

int64_t rmoe_probe_current(void)
{
	return used(STARPU_MAIN_RAM);
}

int64_t rmoe_probe_sample(int heap)
{
	int64_t level = heap ? rmoe_heap_sample() : 0;
	for (int node = 0; node < nodes(); node++) {
		int64_t now = used((unsigned)node);
		level += now;
		int64_t peak = atomic_load_explicit(&peak_bytes[node], memory_order_relaxed);
		while (now > peak && !atomic_compare_exchange_weak_explicit(&peak_bytes[node], &peak, now,
		                                                            memory_order_relaxed, memory_order_relaxed))
			;
	}
	return level;
}

/* The device figure. StarPU 1.3 keeps the device buffer of an unregistered
 * handle in a cache, for a later allocation of the same size, and counts it
 * as used: total - available on a CUDA node is the bytes the data hold plus
 * that cache, as PyTorch's max_memory_reserved counts its allocator's
 * cached blocks. 1.3 has no call that empties the cache or reads its size
 * (memalloc.c keeps both to itself). With RMOE_DEVICE_CACHE=off the vector
 * interface, which every handle of the library uses, is marked dontcache:
 * StarPU then frees an unregistered handle's device buffer at once, and the
 * figure is the bytes the data held, as max_memory_allocated counts live
 * tensors. Each such free is a cudaFree, which waits for the device: a
 * setting for measuring memory, not time. Main memory is unchanged (StarPU
 * frees it at once anyway). Set at the first reset, before a measured pass
 * unregisters anything; any other value keeps the cache. */
static void device_cache_setting(void)
{
	static atomic_int applied;
	int expected = 0;
	if (!atomic_compare_exchange_strong(&applied, &expected, 1))
		return;
	const char *env = rmoe_env(RMOE_ENV_DEVICE_CACHE);
	if (env && !strcmp(env, "off"))
		starpu_interface_vector_ops.dontcache = 1;
}

void rmoe_probe_reset(void)
{
	device_cache_setting();
	for (int node = 0; node < nodes(); node++)
		atomic_store(&peak_bytes[node], used((unsigned)node));
}

int64_t rmoe_probe_peak(void)
{
	return atomic_load(&peak_bytes[STARPU_MAIN_RAM]);
}

int64_t rmoe_probe_device_peak(void)
{
	int64_t peak = 0;
	for (int node = 0; node < nodes(); node++)
		if (starpu_node_get_kind((unsigned)node) == STARPU_CUDA_RAM && atomic_load(&peak_bytes[node]) > peak)
			peak = atomic_load(&peak_bytes[node]);
	return peak;
}
