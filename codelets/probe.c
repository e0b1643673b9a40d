/* Memory probe: the bytes StarPU holds on each memory node (main memory and
 * every device), sampled by every codelet on entry and by the sampler
 * thread (sampler.c) while a pass is measured, with a running maximum per node
 * (StarPU 1.3 keeps no peak). Each sample also samples the process heap
 * (heap.c), the figure independent of StarPU's accounting. */
#include <stdatomic.h>

#include "codelet.h"

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

int64_t rmoe_probe_sample(void)
{
	int64_t level = rmoe_heap_sample();
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

void rmoe_probe_reset(void)
{
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
