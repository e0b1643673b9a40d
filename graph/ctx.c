/* The context: MPI and StarPU(-MPI) for one process.
 *
 * Initialisation belongs to the application: MPI and StarPU are started here
 * only when the application has not started them, and rmoe_ctx_destroy stops
 * only what was started here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rmoe_codelets.h"
#include "relaymoe/relaymoe_mpi.h"
#include "rmoe_graph.h"
#include "rmoe_plan.h"

void rmoe_ctx_config_init(struct rmoe_ctx_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->ncpus = 0;
	cfg->ncuda = -1;
	cfg->sched = NULL;
	cfg->verbose = 0;
	cfg->cluster_file = NULL;
}

int rmoe_ctx_ring_order(const rmoe_ctx *ctx, int *order)
{
	if (!ctx || !order)
		return rmoe_error(RMOE_EINVAL, "rmoe_ctx_ring_order: ctx and order must not be NULL");
	memcpy(order, ctx->ring, (size_t)ctx->size * sizeof(int));
	return 0;
}

int rmoe_ctx_rank(const rmoe_ctx *ctx)
{
	return ctx ? ctx->rank : -1;
}

int rmoe_ctx_size(const rmoe_ctx *ctx)
{
	return ctx ? ctx->size : -1;
}

/* CPU workers for this rank when the user did not say: the node's cores
 * shared among its ranks, one of each rank's share left to StarPU-MPI's
 * progress thread when the share has more than one core. */
static int auto_ncpus(int local_size)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (cores < 1)
		cores = 1;
	long share = cores / (local_size > 0 ? local_size : 1);
	if (share >= 2)
		return (int)(share - 1);
	return 1;
}

/* Every rank learns the worst (lowest) code; a rank that did not fail
 * itself reports that another did. */
static int agree(rmoe_ctx *ctx, int rc, const char *what)
{
	int worst = rc;
	if (MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, ctx->comm) != MPI_SUCCESS)
		return rmoe_error(RMOE_EMPI, "MPI_Allreduce failed while %s", what);
	if (!rc && worst)
		return rmoe_error(worst, "another rank failed %s", what);
	return rc;
}

/* The ring order, the same on every rank: from the topology (live, or the
 * cluster description's placement), which every rank derives from the same
 * gathered data. */
static int plan_ring(rmoe_ctx *ctx, const struct rmoe_ctx_config *cfg)
{
	struct rmoe_cluster cluster;
	memset(&cluster, 0, sizeof(cluster));
	ctx->ring = malloc(sizeof(int) * (size_t)ctx->size);
	int rc = ctx->ring ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory");
	if (!rc && cfg->cluster_file)
		rc = rmoe_cluster_load(cfg->cluster_file, &cluster);
	/* Discovery is collective: all ranks enter it, or none. */
	rc = agree(ctx, rc, "to read the cluster description");
	struct rmoe_topology topo;
	memset(&topo, 0, sizeof(topo));
	if (!rc)
		rc = rmoe_topology_discover(ctx->comm, cfg->cluster_file ? &cluster : NULL, &topo);
	if (!rc)
		rc = rmoe_ring_order(&topo, ctx->ring);
	/* Kept for the routing choice of RMOE_DISPATCH_AUTO layers. */
	if (!rc) {
		ctx->edges = calloc((size_t)ctx->size, sizeof(*ctx->edges));
		rc = ctx->edges ? rmoe_ring_edges(&topo, ctx->ring, ctx->edges)
		                : rmoe_error(RMOE_ENOMEM, "out of host memory");
		ctx->device_tflops = topo.f32_tflops;
	}
	if (!rc && ctx->verbose && ctx->rank == 0) {
		fprintf(stderr, "relaymoe: ring over %d node(s) (%s):", topo.nnodes, topo.placement);
		for (int i = 0; i < ctx->size; i++)
			fprintf(stderr, " %d", ctx->ring[i]);
		fprintf(stderr, "\n");
	}
	rmoe_topology_free(&topo);
	rmoe_cluster_free(&cluster);
	rc = agree(ctx, rc, "to plan the ring");
	if (rc)
		return rc;
	/* Ranks that read different cluster descriptions would plan different
	 * rings and wait on each other forever: compare a digest. */
	uint64_t h = 14695981039346656037ULL;
	for (int i = 0; i < ctx->size; i++) {
		h ^= (uint64_t)(uint32_t)ctx->ring[i];
		h *= 1099511628211ULL;
	}
	uint64_t lo = h, hi = h;
	if (MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, ctx->comm) != MPI_SUCCESS ||
	    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, ctx->comm) != MPI_SUCCESS)
		return rmoe_error(RMOE_EMPI, "MPI_Allreduce failed while comparing ring orders");
	if (lo != hi)
		return rmoe_error(RMOE_EMISMATCH,
		                  "the ranks planned different ring orders: give every rank the same cluster "
		                  "description");
	return 0;
}

static int ctx_create(rmoe_ctx **out, const struct rmoe_ctx_config *ucfg, MPI_Comm comm)
{
	struct rmoe_ctx_config cfg;
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_ctx_create: ctx pointer is NULL");
	*out = NULL;
	if (ucfg)
		cfg = *ucfg;
	else
		rmoe_ctx_config_init(&cfg);
	if (cfg.ncpus < 0)
		return rmoe_error(RMOE_EINVAL, "ctx ncpus = %d: expected 0 (automatic) or a positive count",
		                  cfg.ncpus);
	if (cfg.ncuda < -1)
		return rmoe_error(RMOE_EINVAL, "ctx ncuda = %d: expected -1 (all), 0 or a positive count",
		                  cfg.ncuda);

	rmoe_ctx *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return rmoe_error(RMOE_ENOMEM, "rmoe_ctx_create: out of host memory");
	ctx->verbose = cfg.verbose;

	int flag = 0, provided = 0;
	MPI_Initialized(&flag);
	if (!flag) {
		/* The library makes a few MPI calls of its own (collective checks)
		 * while StarPU-MPI's progress thread runs: MULTIPLE is required. */
		if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
			free(ctx);
			return rmoe_error(RMOE_EMPI, "MPI_Init_thread failed");
		}
		ctx->started_mpi = 1;
	} else {
		MPI_Query_thread(&provided);
	}
	if (provided < MPI_THREAD_MULTIPLE) {
		int code = rmoe_error(RMOE_EMPI,
		                      "MPI provides thread level %d, but relaymoe needs MPI_THREAD_MULTIPLE (%d): "
		                      "its collective checks run beside StarPU-MPI's progress thread; "
		                      "initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)",
		                      provided, MPI_THREAD_MULTIPLE);
		if (ctx->started_mpi)
			MPI_Finalize();
		free(ctx);
		return code;
	}

	int starpu_running = starpu_is_initialized();
	if (starpu_running) {
		/* The application runs StarPU and, we assume, StarPU-MPI over comm:
		 * StarPU-MPI 1.3 listens only on the communicator it was started
		 * with, so that is the one every transfer must use. */
		ctx->comm = comm;
	} else {
		/* Our own communicator: our tags cannot meet the application's messages. */
		if (MPI_Comm_dup(comm, &ctx->comm) != MPI_SUCCESS) {
			if (ctx->started_mpi)
				MPI_Finalize();
			free(ctx);
			return rmoe_error(RMOE_EMPI, "MPI_Comm_dup failed");
		}
		ctx->dup_comm = 1;
	}
	MPI_Comm_rank(ctx->comm, &ctx->rank);
	MPI_Comm_size(ctx->comm, &ctx->size);

	MPI_Comm node;
	MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node);
	MPI_Comm_rank(node, &ctx->local_rank);
	MPI_Comm_size(node, &ctx->local_size);
	MPI_Comm_free(&node);

	if (!starpu_running) {
		struct starpu_conf conf;
		starpu_conf_init(&conf);
		if (cfg.ncpus > 0)
			conf.ncpus = cfg.ncpus;
		else if (!getenv("STARPU_NCPU"))
			conf.ncpus = auto_ncpus(ctx->local_size);
		conf.ncuda = cfg.ncuda;
		if (cfg.sched)
			conf.sched_policy_name = cfg.sched;
		/* StarPU binds every rank's first worker to core 0 by default: with
		 * several ranks on a node they would all share one core. */
		if (ctx->local_size > 1)
			setenv("STARPU_WORKERS_NOBIND", "1", 0);
		int ret = starpu_mpi_init_conf(NULL, NULL, 0, ctx->comm, &conf);
		if (ret != 0) {
			MPI_Comm_free(&ctx->comm);
			if (ctx->started_mpi)
				MPI_Finalize();
			free(ctx);
			if (ret == -ENODEV)
				return rmoe_error(RMOE_ESTARPU, "StarPU found no worker to run on (ncpus=%d, ncuda=%d)",
				                  conf.ncpus, conf.ncuda);
			return rmoe_error(RMOE_ESTARPU, "starpu_mpi_init_conf failed (%d)", ret);
		}
		ctx->started_starpu_mpi = 1;
	}
	rmoe_codelets_init();

	int rc = plan_ring(ctx, &cfg);
	if (rc) {
		rmoe_ctx_destroy(ctx);
		return rc;
	}

	int64_t *ub = NULL;
	int ubflag = 0;
	starpu_mpi_comm_get_attr(ctx->comm, STARPU_MPI_TAG_UB, &ub, &ubflag);
	int64_t tag_ub = (ubflag && ub) ? *ub : 32767; /* the MPI standard's guaranteed minimum */
	/* The upper half of the tag space: an application sharing StarPU-MPI's
	 * communicator keeps the lower half. */
	ctx->tag_first = tag_ub / 2;
	ctx->tag_last = tag_ub;
	ctx->tag_next = ctx->tag_first;

	*out = ctx;
	return 0;
}

int rmoe_ctx_create(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg)
{
	return ctx_create(ctx, cfg, MPI_COMM_WORLD);
}

int rmoe_ctx_create_fcomm(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg, int fortran_comm)
{
	int flag = 0;
	MPI_Initialized(&flag);
	if (!flag)
		return rmoe_error(RMOE_EMPI, "a Fortran communicator (%d) was given but MPI is not initialised",
		                  fortran_comm);
	return ctx_create(ctx, cfg, MPI_Comm_f2c((MPI_Fint)fortran_comm));
}

int rmoe_ctx_create_comm(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg, MPI_Comm comm)
{
	int flag = 0;
	MPI_Initialized(&flag);
	if (!flag)
		return rmoe_error(RMOE_EMPI, "a communicator was given but MPI is not initialised");
	return ctx_create(ctx, cfg, comm);
}

int rmoe_ctx_destroy(rmoe_ctx *ctx)
{
	if (!ctx)
		return 0;
	if (ctx->nlayers > 0)
		return rmoe_error(RMOE_ESTATE, "rmoe_ctx_destroy: %d layer(s) still alive; destroy them first",
		                  ctx->nlayers);
	if (ctx->started_starpu_mpi)
		starpu_mpi_shutdown();
	else
		starpu_task_wait_for_all();
	if (ctx->dup_comm)
		MPI_Comm_free(&ctx->comm);
	if (ctx->started_mpi)
		MPI_Finalize();
	free(ctx->ring);
	free(ctx->edges);
	free(ctx);
	return 0;
}
