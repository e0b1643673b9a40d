/* The context: MPI and StarPU(-MPI) for one process.
 *
 * Initialisation belongs to the application: MPI and StarPU are started here
 * only when the application has not started them, and rmoe_ctx_destroy stops
 * only what was started here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rmoe_codelets.h"
#include "rmoe_config.h"
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
	cfg->trace = NULL;
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

/* ---- FxT traces (rmoe_ctx_config.trace) -------------------------------------
 *
 * StarPU reads its FxT settings from the environment when it starts, so only
 * a context that starts StarPU can trace, and there is at most one such
 * context at a time: its state lives here rather than in every context. */
static const char *const trace_env[] = {"STARPU_FXT_PREFIX", "STARPU_FXT_SUFFIX", "STARPU_FXT_TRACE"};
#define TRACE_NENV (sizeof(trace_env) / sizeof(trace_env[0]))
static struct {
	const rmoe_ctx *owner;        /* the tracing context, NULL when none */
	char *dir;
	char *saved[TRACE_NENV];      /* the environment before, restored at destroy */
	int had[TRACE_NENV];
} tracing;


static void trace_restore_env(void)
{
	for (size_t i = 0; i < TRACE_NENV; i++) {
		if (tracing.had[i])
			setenv(trace_env[i], tracing.saved[i], 1);
		else
			unsetenv(trace_env[i]);
		free(tracing.saved[i]);
		tracing.saved[i] = NULL;
	}
}

/* Before StarPU starts: the folder, and the environment FxT reads. */
static int trace_prepare(rmoe_ctx *ctx, const char *dir, int starpu_running)
{
	if (!dir) {
#ifdef RMOE_STARPU_HAS_FXT
		/* StarPU 1.3 built with FxT traces every run unless told not to,
		 * leaving a prof_file in /tmp each time; an explicit setting wins. */
		if (!starpu_running)
			setenv("STARPU_FXT_TRACE", "0", 0);
#else
		(void)starpu_running;
#endif
		(void)ctx;
		return 0;
	}
#ifndef RMOE_STARPU_HAS_FXT
	(void)ctx;
	(void)starpu_running;
	return rmoe_error(RMOE_ENOTSUP,
	                  "trace '%s': the StarPU relaymoe was built against has no FxT; build one with "
	                  "scripts/build-starpu.sh --fxt --prefix DIR and configure relaymoe with "
	                  "-DRMOE_STARPU_PREFIX=DIR",
	                  dir);
#else
	if (starpu_running)
		return rmoe_error(RMOE_ENOTSUP,
		                  "trace '%s': StarPU was already running when the context was created; FxT is "
		                  "set up before StarPU starts (STARPU_FXT_PREFIX, STARPU_FXT_TRACE=1)",
		                  dir);
	if (tracing.owner)
		return rmoe_error(RMOE_ESTATE, "trace '%s': another context of this process is tracing into '%s'",
		                  dir, tracing.dir);
	if (ctx->size > STARPU_FXT_MAX_FILES)
		return rmoe_error(RMOE_ENOTSUP, "trace '%s': %d ranks, but StarPU 1.3 merges at most %d traces",
		                  dir, ctx->size, STARPU_FXT_MAX_FILES);
	/* StarPU builds the converted files' paths in 256 bytes. */
	if (strlen(dir) > 200)
		return rmoe_error(RMOE_EINVAL, "trace '%s': a folder name of at most 200 characters is expected",
		                  dir);
	int err = rmoe_mkdir_p(dir);
	if (err)
		return rmoe_error(RMOE_EIO, "trace: cannot create the folder '%s' (%s)", dir, strerror(err));
	tracing.dir = strdup(dir);
	if (!tracing.dir)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	for (size_t i = 0; i < TRACE_NENV; i++) {
		const char *v = getenv(trace_env[i]);
		tracing.had[i] = v != NULL;
		tracing.saved[i] = v ? strdup(v) : NULL;
	}
	/* prof_file_<rank>: StarPU-MPI numbers each file with the rank. */
	setenv("STARPU_FXT_PREFIX", dir, 1);
	setenv("STARPU_FXT_SUFFIX", "prof_file", 1);
	setenv("STARPU_FXT_TRACE", "1", 1);
	tracing.owner = ctx;
	return 0;
#endif
}

/* Restores the environment as it was and forgets the trace. */
static void trace_release(const rmoe_ctx *ctx)
{
	if (!tracing.owner || tracing.owner != ctx)
		return;
	trace_restore_env();
	free(tracing.dir);
	tracing.dir = NULL;
	tracing.owner = NULL;
}

#ifdef RMOE_STARPU_HAS_FXT
/* What the converted trace does not say: the ring and where the tags start.
 * StarPU 1.3 records an MPI tag in 32 bits, so scripts/trace/ finds a
 * transfer's pass and hop from the tag's offset past tag_first. */
static int trace_write_layout(const rmoe_ctx *ctx, const char *dir)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/relaymoe-trace.txt", dir);
	FILE *f = fopen(path, "w");
	if (!f)
		return rmoe_error(RMOE_EIO, "trace: cannot write '%s' (%s)", path, strerror(errno));
	fprintf(f, "# relaymoe %s: the ring and tag layout of this trace (scripts/trace/)\n",
	        RMOE_VERSION_STRING);
	fprintf(f, "ranks %d\nring", ctx->size);
	for (int i = 0; i < ctx->size; i++)
		fprintf(f, " %d", ctx->ring[i]);
	fprintf(f, "\ntag_first %lld\n", (long long)ctx->tag_first);
	return fclose(f) == 0 ? 0 : rmoe_error(RMOE_EIO, "trace: cannot write '%s'", path);
}

/* After StarPU has written every rank's file: merge and convert them on
 * rank 0, as starpu_fxt_tool -i prof_file_0 ... -d DIR would. */
static int trace_convert(const rmoe_ctx *ctx, const char *dir)
{
	int rc = trace_write_layout(ctx, dir);
	if (rc)
		return rc;
	/* starpu_fxt_options_init leaves fields the conversion frees (the
	 * workers' device lists) unset: zero them first, as a static would be. */
	struct starpu_fxt_options opt;
	memset(&opt, 0, sizeof(opt));
	starpu_fxt_options_init(&opt);
	char *names[STARPU_FXT_MAX_FILES];
	for (int r = 0; r < ctx->size; r++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/prof_file_%d", dir, r);
		if (access(path, R_OK) != 0) {
			for (int i = 0; i < r; i++)
				free(names[i]);
			return rmoe_error(RMOE_EIO,
			                  "trace: rank %d's file '%s' is not readable from rank 0 (%s); with ranks on "
			                  "several nodes the trace folder must be on a shared file system",
			                  r, path, strerror(errno));
		}
		names[r] = strdup(path);
		opt.filenames[r] = names[r];
	}
	opt.ninputfiles = (unsigned)ctx->size;
	opt.dir = (char *)dir;
	starpu_fxt_options_set_dir(&opt);
	starpu_fxt_generate_trace(&opt);
	starpu_fxt_options_shutdown(&opt);
	for (int r = 0; r < ctx->size; r++)
		free(names[r]);
	char paje[4096];
	snprintf(paje, sizeof(paje), "%s/paje.trace", dir);
	if (access(paje, R_OK) != 0)
		return rmoe_error(RMOE_EIO, "trace: converting the FxT files in '%s' left no paje.trace", dir);
	return 0;
}
#endif

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
#ifdef STARPU_SIMGRID
	/* StarPU-MPI initialised SMPI before the application's main ran. */
	flag = 1;
#else
	MPI_Initialized(&flag);
#endif
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
#ifdef STARPU_SIMGRID
	/* SMPI reports MPI_THREAD_SINGLE, yet its simulated threads never run
	 * at once (SimGrid schedules them one by one): any of them may call MPI. */
	provided = MPI_THREAD_MULTIPLE;
#endif
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
#ifdef STARPU_SIMGRID
		/* StarPU-MPI over SMPI works on MPI_COMM_WORLD only; the tags
		 * keep to their window of it (tags.c). */
		ctx->comm = comm;
#else
		/* Our own communicator: our tags cannot meet the application's messages. */
		if (MPI_Comm_dup(comm, &ctx->comm) != MPI_SUCCESS) {
			if (ctx->started_mpi)
				MPI_Finalize();
			free(ctx);
			return rmoe_error(RMOE_EMPI, "MPI_Comm_dup failed");
		}
		ctx->dup_comm = 1;
#endif
	}
	MPI_Comm_rank(ctx->comm, &ctx->rank);
	MPI_Comm_size(ctx->comm, &ctx->size);

	MPI_Comm node;
	MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &node);
	MPI_Comm_rank(node, &ctx->local_rank);
	MPI_Comm_size(node, &ctx->local_size);
	MPI_Comm_free(&node);

	int trc = agree(ctx, trace_prepare(ctx, cfg.trace, starpu_running), "to set up the trace");
	if (trc) {
		trace_release(ctx);
		if (ctx->dup_comm)
			MPI_Comm_free(&ctx->comm);
		if (ctx->started_mpi)
			MPI_Finalize();
		free(ctx);
		return trc;
	}
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
#ifdef STARPU_SIMGRID
		/* StarPU charges every simulated cudaMalloc and pinned host
		 * allocation (175 us, 650 us per MiB); the frameworks the paper
		 * compares reuse device memory through a caching allocator, whose
		 * steady state costs nothing. STARPU_SIMGRID_CUDA_MALLOC_COST=1
		 * restores StarPU's model. */
		setenv("STARPU_SIMGRID_CUDA_MALLOC_COST", "0", 0);
#endif
		int ret = starpu_mpi_init_conf(NULL, NULL, 0, ctx->comm, &conf);
		if (ret != 0) {
			trace_release(ctx);
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
#ifdef STARPU_SIMGRID
		/* Simulated data carries nothing: StarPU's own buffers in main
		 * memory (temporaries, transfers staged through the host) are
		 * folded too, as the layer's are (layer.c). Not pinned: see the
		 * allocation cost above. */
		starpu_malloc_on_node_set_default_flags(STARPU_MAIN_RAM,
		                                        STARPU_MALLOC_COUNT | STARPU_MALLOC_SIMULATION_FOLDED);
#endif
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
	int rc = 0;
	if (tracing.owner == ctx) {
#ifdef RMOE_STARPU_HAS_FXT
		/* starpu_shutdown has written each rank's file: wait for all of them. */
		if (MPI_Barrier(ctx->comm) != MPI_SUCCESS)
			rc = rmoe_error(RMOE_EMPI, "MPI_Barrier failed before converting the trace");
		else if (ctx->rank == 0)
			rc = trace_convert(ctx, tracing.dir);
#endif
		trace_release(ctx);
	}
	if (ctx->dup_comm)
		MPI_Comm_free(&ctx->comm);
	if (ctx->started_mpi)
		MPI_Finalize();
	free(ctx->ring);
	free(ctx->edges);
	free(ctx);
	return rc;
}
