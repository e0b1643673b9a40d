/* What the ranks of a context find about themselves and tell each other:
 * host names and GPUs (for the topology, at context creation) and where a
 * layer's buffers live with how much memory is left there (at layer
 * creation). The planner (scheduler/) receives the gathered plain data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "rmoe_collective.h"
#include "rmoe_ctx.h"
#include "rmoe_system.h"

/* Gathers one fixed-size record per rank into all (rank order), once every
 * rank could allocate its copy. */
static int gather_records(rmoe_ctx *ctx, struct rmoe_wait *w, const void *mine, void *all, size_t size,
                          const char *what)
{
	int rc = rmoe_agree(w, ctx->comm, all ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory %s", what), what);
	if (!rc)
		rc = rmoe_allgather_bounded(w, mine, all, (int)size, MPI_BYTE, ctx->comm, what);
	return rc;
}

int rmoe_discover_topology(rmoe_ctx *ctx, struct rmoe_wait *w, const struct rmoe_cluster *cluster, int ranks_per_node,
                           struct rmoe_topology *out)
{
	memset(out, 0, sizeof(*out));
	char name[MPI_MAX_PROCESSOR_NAME + 1] = "";
	int len = 0;
	if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS || len <= 0)
		snprintf(name, sizeof(name), "rank-%d", ctx->rank);   /* its own node, which is safe */
	name[MPI_MAX_PROCESSOR_NAME] = '\0';
	/* Emulated nodes: the node's number is its host name, so the
	 * topology groups them as it groups hosts. */
	if (ranks_per_node > 0)
		snprintf(name, sizeof(name), "node-%d", ctx->rank / ranks_per_node);
	struct rmoe_rank_info me;
	struct rmoe_local_hw hw;
	rmoe_rank_info_local(name, &me, &hw);

	struct rmoe_rank_info *all = malloc(sizeof(*all) * (size_t)ctx->size);
	int rc = gather_records(ctx, w, &me, all, sizeof(me), "gathering the topology");
	if (!rc) {
		for (int r = 0; r < ctx->size; r++)
			all[r].host[RMOE_HOST_MAX - 1] = '\0';
		rc = rmoe_topology_from_ranks(all, ctx->size, cluster, out);
	}
	if (!rc)
		out->local = hw;
	free(all);
	return rc;
}

/* This rank's device: its CUDA worker's memory node when it has one (the
 * layer's data would live there), else host memory. */
static void probe_device(rmoe_ctx *ctx, struct rmoe_device_info *d)
{
	memset(d, 0, sizeof(*d));
#ifdef STARPU_USE_CUDA
	int worker = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
	if (worker >= 0) {
		unsigned node = starpu_worker_get_memory_node((unsigned)worker);
		starpu_ssize_t avail = starpu_memory_get_available(node);
		d->kind = RMOE_DEVICE_CUDA;
		d->memory_bytes = avail > 0 ? (int64_t)avail : 0;
		char wname[64];
		starpu_worker_get_name(worker, wname, sizeof(wname));
		snprintf(d->source, sizeof(d->source), "the memory StarPU finds available on %s", wname);
		return;
	}
#endif
	d->kind = RMOE_DEVICE_CPU;
	double avail = rmoe_host_memory_available(ctx->local_size, d->source, sizeof(d->source));
	d->memory_bytes = avail >= 0 ? (int64_t)avail : 0;
}

int rmoe_discover_devices(rmoe_ctx *ctx, struct rmoe_wait *w, struct rmoe_device_info *out)
{
	struct rmoe_device_info me;
	probe_device(ctx, &me);
	int rc = gather_records(ctx, w, &me, out, sizeof(me), "gathering the devices' memory");
	for (int r = 0; !rc && r < ctx->size; r++)
		out[r].source[sizeof(out[r].source) - 1] = '\0';
	return rc;
}
