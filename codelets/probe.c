/* Memory probe: the bytes StarPU holds in main memory, sampled by every
 * codelet on entry, with a running maximum (StarPU 1.3 keeps no peak). */
#include <stdatomic.h>

#include "codelet.h"

static _Atomic int64_t rmoe_probe_peak_bytes;

int64_t rmoe_probe_current(void)
{
	/* 1.3 has no starpu_memory_get_used. */
	starpu_ssize_t total = starpu_memory_get_total(STARPU_MAIN_RAM);
	starpu_ssize_t available = starpu_memory_get_available(STARPU_MAIN_RAM);
	if (total < 0 || available < 0 || available > total)
		return 0;
	return (int64_t)(total - available);
}

void rmoe_probe_sample(void)
{
	int64_t now = rmoe_probe_current();
	int64_t peak = atomic_load_explicit(&rmoe_probe_peak_bytes, memory_order_relaxed);
	while (now > peak &&
	       !atomic_compare_exchange_weak_explicit(&rmoe_probe_peak_bytes, &peak, now,
	                                              memory_order_relaxed, memory_order_relaxed))
		;
}

void rmoe_probe_reset(void)
{
	atomic_store(&rmoe_probe_peak_bytes, rmoe_probe_current());
}

int64_t rmoe_probe_peak(void)
{
	return atomic_load(&rmoe_probe_peak_bytes);
}
