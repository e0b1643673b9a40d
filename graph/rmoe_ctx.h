/* The context behind the public rmoe_ctx: MPI and StarPU(-MPI) for one
 * process, the topology its ranks gathered, the ring planned from it, and
 * the window of StarPU-MPI tags its layers use. Private to graph/. */
#ifndef RMOE_CTX_H
#define RMOE_CTX_H

#include <mpi.h>
#include <stdint.h>

#include "relaymoe/relaymoe.h"
#include "rmoe_plan.h"

struct rmoe_ctx {
	MPI_Comm comm;            /* StarPU-MPI's communicator: every transfer rides it */
	int rank, size;
	int local_rank, local_size;   /* ranks sharing this node */
	MPI_Comm node;            /* those ranks; MPI_COMM_NULL until split, freed on destroy */
	int started_mpi;          /* what rmoe_ctx_create started, and must stop */
	int started_starpu_mpi;
	int host_cache;           /* installed the host buffer cache (uninstall after StarPU) */
	int dup_comm;             /* comm is our duplicate, freed on destroy */
	int codelets_started;     /* rmoe_codelets_start was called (cuBLAS handles) */
	int verbose;
	int64_t tag_first, tag_last, tag_next;  /* tag window, see tags.c */
	int nlayers;              /* layers alive, for a clean destroy */
	struct rmoe_topology topo;    /* gathered at creation (discover.c); every layer plans on it */
	int *ring;                /* the plan's ring order: ring[i] = rank at position i */
	int ring_rank_order;      /* rmoe_ctx_config.ring_order is RMOE_RING_RANK */
	int blas_threads;         /* what rmoe_codelets_blas_threads set (0: no OpenBLAS) */
};

/* Collective over ctx->comm: probes this machine (hwloc), gathers every
 * rank's host name and GPU count, and builds the topology (with a cluster
 * description's placement, links and rates when cluster is not NULL).
 * Every rank enters the same collectives whatever fails. */
int rmoe_discover_topology(rmoe_ctx *ctx, const struct rmoe_cluster *cluster, struct rmoe_topology *out);

/* Collective over ctx->comm: where each rank's layer buffers live and how
 * much memory it may hold there, now (out[nranks]). */
int rmoe_discover_devices(rmoe_ctx *ctx, struct rmoe_device_info *out);

/* The memory node of this rank's device (its first CUDA worker's), or -1
 * without one. */
int rmoe_ctx_device_node(const rmoe_ctx *ctx);

/* Reserve count consecutive StarPU-MPI tags for one pass. All ranks call it
 * in the same order, so they agree on the block. */
int rmoe_tags_reserve(rmoe_ctx *ctx, int64_t count, int64_t *base);

/* FxT traces (trace.c): before StarPU starts, the folder and the
 * environment FxT reads (dir NULL: no trace); at destroy, after StarPU has
 * written every rank's file, their merge on rank 0; and the environment as
 * it was. */
int rmoe_trace_prepare(rmoe_ctx *ctx, const char *dir, int starpu_running);
int rmoe_trace_finish(rmoe_ctx *ctx);
void rmoe_trace_release(const rmoe_ctx *ctx);

#endif /* RMOE_CTX_H */
