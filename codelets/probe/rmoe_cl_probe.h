/* The memory probes' sampling, private to codelets/ (the probes' public
 * side is in rmoe_codelets.h): StarPU's bytes on every node (probe.c) and
 * the heap's (heap.c), read at every task's start and by the sampler
 * thread (sampler.c); the runtime's own structures (bookkeeping.c) and the
 * main-memory cache (host_cache.c) beside them. */
#ifndef RMOE_CL_PROBE_H
#define RMOE_CL_PROBE_H

#include <stdint.h>
#include <starpu.h>

#include "rmoe_codelets.h"
#include "rmoe_config.h"
#include "rmoe_error.h"

/* Memory probe (probe.c): called by rmoe_cl_unpack and the sampler
 * thread (sampler.c); with heap, samples the heap probe too (heap.c).
 * Each returns the level it read (the probe: StarPU's bytes on every node
 * plus the heap's), which the sampler watches for change. */
int64_t rmoe_probe_sample(int heap);
int64_t rmoe_heap_sample(void);

#endif /* RMOE_CL_PROBE_H */
