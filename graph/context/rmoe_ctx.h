/* The context behind the public rmoe_ctx: MPI and StarPU(-MPI) for one
 * process, the topology its ranks gathered, the ring planned from it, and
 * the window of StarPU-MPI tags its layers use. Private to graph/. */
#ifndef RMOE_CTX_H
#define RMOE_CTX_H

#include <mpi.h>
#include <stdint.h>

#include "relaymoe/relaymoe.h"
#include "rmoe_plan.h"

struct rmoe_wait; /* rmoe_collective.h */

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
	struct rmoe_task_log *task_log;   /* RMOE_TASK_LOG's file of this rank, or NULL */
};

/* ---- the steps of rmoe_ctx_create (ctx.c), each 0 or an RMOE_E* code ---- */

/* MPI as the application left it, or started here with the thread level
 * the library needs; comm duplicated unless StarPU-MPI already runs on it
 * (ctx_mpi.c). */
int rmoe_ctx_mpi(rmoe_ctx *ctx, MPI_Comm comm, int starpu_running);
/* StarPU and StarPU-MPI on the context's communicator (ctx_starpu.c). */
int rmoe_ctx_starpu(rmoe_ctx *ctx, const struct rmoe_ctx_config *cfg);
/* Before the start: RMOE_EINVAL when the policy StarPU would use is not one
 * it knows (ctx_policy.c says why); on a node's first start, StarPU's bus
 * calibration by the node's first rank alone (ctx_bus.c; not in the
 * simulation). */
int rmoe_ctx_check_policy(const struct rmoe_ctx_config *cfg);
struct starpu_conf;
int rmoe_ctx_calibrate_bus_once(const rmoe_ctx *ctx, const struct starpu_conf *conf);
/* The OpenBLAS threads per call (the configuration's, or automatic) and
 * the advice on OpenBLAS's kernel set (ctx_blas.c). */
void rmoe_ctx_blas_setup(rmoe_ctx *ctx, const struct rmoe_ctx_config *cfg);
/* The topology (live, or the cluster description's placement) and the ring
 * planned on it (scheduler/plan.c), the same on every rank: every rank
 * derives them from the same gathered data, and they compare a digest
 * (ctx_ring.c). */
int rmoe_ctx_plan_ring(rmoe_ctx *ctx, struct rmoe_wait *w, const struct rmoe_ctx_config *cfg);

/* ---- what the context's layers use -------------------------------------- */

/* Collective over ctx->comm: probes this machine (hwloc), gathers every
 * rank's host name and GPU count, and builds the topology (with a cluster
 * description's placement, links and rates when cluster is not NULL).
 * Every rank enters the same collectives whatever fails. ranks_per_node >
 * 0: consecutive ranks, that many at a time, are one node
 * (rmoe_ctx_config.ranks_per_node), whatever their hosts. */
int rmoe_discover_topology(rmoe_ctx *ctx, struct rmoe_wait *w, const struct rmoe_cluster *cluster, int ranks_per_node,
                           struct rmoe_topology *out);

/* Collective over ctx->comm: where each rank's layer buffers live and how
 * much memory it may hold there, now (out[nranks]). */
int rmoe_discover_devices(rmoe_ctx *ctx, struct rmoe_wait *w, struct rmoe_device_info *out);

/* The memory node of this rank's device (its first CUDA worker's), or -1
 * without one. */
int rmoe_ctx_device_node(const rmoe_ctx *ctx);

/* The tag window of the context (tags.c). */
void rmoe_tags_init(rmoe_ctx *ctx);
/* Reserve count consecutive StarPU-MPI tags for one pass. All ranks call it
 * in the same order, so they agree on the block. */
int rmoe_tags_reserve(rmoe_ctx *ctx, int64_t count, int64_t *base);

/* The bytes of a StarPU-MPI send's and receive's structures, measured with
 * requests to this rank itself (transfers.c) for the bookkeeping term
 * (rmoe_bookkeeping_set_requests); leaves the tag window as
 * rmoe_tags_init does. Before any pass. */
int rmoe_requests_measure(rmoe_ctx *ctx);

/* FxT traces (trace.c): before StarPU starts, the folder and the
 * environment FxT reads (dir NULL: no trace); at destroy, after StarPU has
 * written every rank's file, their merge on rank 0; and the environment as
 * it was. */
int rmoe_trace_prepare(rmoe_ctx *ctx, const char *dir, int starpu_running);
int rmoe_trace_finish(rmoe_ctx *ctx);
void rmoe_trace_release(const rmoe_ctx *ctx);

#endif /* RMOE_CTX_H */
