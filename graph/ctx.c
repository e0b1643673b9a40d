/* The context: MPI and StarPU(-MPI) for one process, the topology its
 * ranks share and the ring planned on it.
 *
 * Initialisation belongs to the application: MPI and StarPU are started here
 * only when the application has not started them, and rmoe_ctx_destroy stops
 * only what was started here. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <starpu.h>
#include <starpu_mpi.h>

#include "relaymoe/relaymoe_mpi.h"
#include "rmoe_codelets.h"
#include "rmoe_collective.h"
#include "rmoe_config.h"
#include "rmoe_ctx.h"

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

/* OpenBLAS threads per call when the user did not say (rmoe_ctx_config.
 * blas_threads): OPENBLAS_NUM_THREADS when set (the user's, as OpenBLAS
 * itself reads it), otherwise the rank's share of the cores it may run on, less
 * its CUDA workers' driver threads, over its CPU workers. A pass is a chain
 * of expert tasks (one per hop), so with one BLAS thread per worker the
 * cores a rank's workers leave (1 rank on 2 cores: auto_ncpus gives one
 * worker) would idle through every GEMM; the share keeps ranks that share
 * the node's cores (2 ranks on 2 cores: 1 thread each) and workers running
 * GEMMs side by side from oversubscribing them. */
static int auto_blas_threads(int local_size)
{
	const char *env = getenv("OPENBLAS_NUM_THREADS");
	if (env && *env) {
		char *end;
		long n = strtol(env, &end, 10);
		if (!*end && n >= 1 && n <= 4096)
			return (int)n;
	}
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	/* A process confined to fewer CPUs (a container's cpuset, mpirun's
	 * binding) has only those: its ranks on the node then share at most
	 * them, never more threads than CPUs. */
	cpu_set_t allowed;
	if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) < cores)
		cores = CPU_COUNT(&allowed);
	long share = (cores > 0 ? cores : 1) / (local_size > 0 ? local_size : 1);
	share -= (long)starpu_cuda_worker_get_count();
	long workers = (long)starpu_cpu_worker_get_count();
	long n = workers > 0 ? share / workers : 1;
	return n > 1 ? (int)n : 1;
}

/* The topology (live, or the cluster description's placement) and the ring
 * planned on it (scheduler/plan.c), the same on every rank: every rank
 * derives them from the same gathered data, and they compare a digest. */
static int plan_ring(rmoe_ctx *ctx, const struct rmoe_ctx_config *cfg)
{
	struct rmoe_cluster cluster;
	memset(&cluster, 0, sizeof(cluster));
	int rc = cfg->cluster_file ? rmoe_cluster_load(cfg->cluster_file, &cluster) : 0;
	if (!rc && cfg->ring_order != RMOE_RING_PLANNED && cfg->ring_order != RMOE_RING_RANK)
		rc = rmoe_error(RMOE_EINVAL, "ctx ring_order = %d: expected RMOE_RING_PLANNED (0) or RMOE_RING_RANK (1)",
		                cfg->ring_order);
	/* Every layer plans on the context's topology with the same request
	 * (layer.c), so its ring is this one. */
	ctx->ring_rank_order = cfg->ring_order == RMOE_RING_RANK;
	/* Discovery is collective: all ranks enter it, or none. */
	if ((rc = rmoe_agree(ctx->comm, rc, "to read the cluster description"))) {
		rmoe_cluster_free(&cluster);
		return rc;
	}
	rc = rmoe_discover_topology(ctx, cfg->cluster_file ? &cluster : NULL, &ctx->topo);
	rmoe_cluster_free(&cluster);
	struct rmoe_plan plan;
	memset(&plan, 0, sizeof(plan));
	struct rmoe_plan_request ring_only = {.rank_order = ctx->ring_rank_order};
	if (!rc)
		rc = rmoe_plan_make(&ring_only, &ctx->topo, &plan);
	if (!rc) {
		ctx->ring = plan.order;
		plan.order = NULL;
	}
	rmoe_plan_free(&plan);
	if (!rc && ctx->verbose && ctx->rank == 0) {
		fprintf(stderr, "relaymoe: %s ring over %d node(s) (%s):", ctx->ring_rank_order ? "rank-order" : "planned",
		        ctx->topo.nnodes, ctx->topo.placement);
		for (int i = 0; i < ctx->size; i++)
			fprintf(stderr, " %d", ctx->ring[i]);
		fprintf(stderr, "\n");
	}
	if ((rc = rmoe_agree(ctx->comm, rc, "to plan the ring")))
		return rc;
	/* Ranks that read different cluster descriptions would plan different
	 * rings and wait on each other forever. */
	uint64_t h = rmoe_hash_init();
	for (int i = 0; i < ctx->size; i++)
		h = rmoe_hash_i64(h, ctx->ring[i]);
	int same = rmoe_agree_digest(ctx->comm, h, "comparing ring orders");
	if (same < 0)
		return same;
	if (!same)
		return rmoe_error(RMOE_EMISMATCH, "the ranks planned different ring orders: give every rank the same "
		                                  "cluster description and ring_order");
	return 0;
}

/* MPI as the application left it, or started here with the thread level
 * the library needs; comm duplicated unless StarPU-MPI already runs on it. */
static int ctx_mpi(rmoe_ctx *ctx, MPI_Comm comm, int starpu_running)
{
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
		if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
			return rmoe_error(RMOE_EMPI, "MPI_Init_thread failed");
		ctx->started_mpi = 1;
	} else {
		MPI_Query_thread(&provided);
	}
#ifdef STARPU_SIMGRID
	/* SMPI reports MPI_THREAD_SINGLE, yet its simulated threads never run
	 * at once (SimGrid schedules them one by one): any of them may call MPI. */
	provided = MPI_THREAD_MULTIPLE;
#endif
	if (provided < MPI_THREAD_MULTIPLE)
		return rmoe_error(RMOE_EMPI,
		                  "MPI provides thread level %d, but relaymoe needs MPI_THREAD_MULTIPLE (%d): its "
		                  "collective checks run beside StarPU-MPI's progress thread; initialise MPI with "
		                  "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)",
		                  provided, MPI_THREAD_MULTIPLE);
	ctx->comm = comm;
#ifndef STARPU_SIMGRID
	/* The application runs StarPU and, we assume, StarPU-MPI over comm:
	 * StarPU-MPI 1.3 listens only on the communicator it was started with,
	 * so that is the one every transfer must use. Otherwise our own
	 * communicator: our tags cannot meet the application's messages.
	 * (Under simulation StarPU-MPI over SMPI works on MPI_COMM_WORLD only;
	 * the tags keep to their window of it, tags.c.) */
	if (!starpu_running) {
		if (MPI_Comm_dup(comm, &ctx->comm) != MPI_SUCCESS)
			return rmoe_error(RMOE_EMPI, "MPI_Comm_dup failed");
		ctx->dup_comm = 1;
	}
#else
	(void)starpu_running;
#endif
	MPI_Comm_rank(ctx->comm, &ctx->rank);
	MPI_Comm_size(ctx->comm, &ctx->size);
	MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &ctx->node);
	MPI_Comm_rank(ctx->node, &ctx->local_rank);
	MPI_Comm_size(ctx->node, &ctx->local_size);
	return 0;
}

/* A policy StarPU does not know is replaced by its default with a warning
 * only: a scheduler experiment would measure another policy than the one
 * it names. The name StarPU will use (STARPU_SCHED wins over the
 * configuration's, as in StarPU) must be one of StarPU's; "help" (StarPU
 * lists them) and "heft" (StarPU 1.3's alias of dmda) pass. */
static int check_policy(const struct rmoe_ctx_config *cfg)
{
	const char *env = getenv("STARPU_SCHED");
	const char *name = env && *env ? env : cfg->sched;
	if (!name || !*name || !strcmp(name, "help") || !strcmp(name, "heft"))
		return 0;
	/* The message names the classic policies and counts the modular ones. */
	char known[400] = "";
	size_t used = 0;
	int modular = 0;
	for (struct starpu_sched_policy **p = starpu_sched_get_predefined_policies(); p && *p; p++) {
		const char *pn = (*p)->policy_name;
		if (!pn)
			continue;
		if (!strcmp(pn, name))
			return 0;
		if (!strncmp(pn, "modular-", 8)) {
			modular++;
			continue;
		}
		int n = snprintf(known + used, sizeof(known) - used, "%s%s", used ? ", " : "", pn);
		if (n > 0 && (size_t)n < sizeof(known) - used)
			used += (size_t)n;
	}
	const int from_env = name == env && (!cfg->sched || strcmp(env, cfg->sched));
	return rmoe_error(RMOE_EINVAL, "scheduling policy '%s'%s is not one StarPU knows: expected one of %s, or one of "
	                  "its %d modular-* policies", name, from_env ? " (STARPU_SCHED)" : "", known, modular);
}

#ifndef STARPU_SIMGRID
/* Whether StarPU's bus calibration of this host is on disk: the files
 * StarPU 1.3 reads at start-up (perfmodel_bus.c), at the path it uses:
 * STARPU_PERF_MODEL_DIR, else XDG_CACHE_HOME, STARPU_HOME or HOME with
 * .starpu/sampling; the host is STARPU_HOSTNAME or the host name up to its
 * first dot. */
static int bus_calibrated(void)
{
	char host[256], dir[4096], path[4400];
	const char *forced = getenv("STARPU_HOSTNAME");
	if (forced && *forced) {
		snprintf(host, sizeof(host), "%s", forced);
	} else {
		if (gethostname(host, sizeof(host) - 1))
			return 0;
		host[sizeof(host) - 1] = 0;
		char *dot = strchr(host, '.');
		if (dot)
			*dot = 0;
	}
	const char *models = getenv("STARPU_PERF_MODEL_DIR");
	if (models) {
		snprintf(dir, sizeof(dir), "%s/bus", models);
	} else {
		const char *home = getenv("XDG_CACHE_HOME");
		if (!home)
			home = getenv("STARPU_HOME");
		if (!home)
			home = getenv("HOME");
		if (!home)
			return 0;
		snprintf(dir, sizeof(dir), "%s/.starpu/sampling/bus", home);
	}
	/* (HOST.affinity too, but only where StarPU has CUDA or OpenCL.) */
	static const char *const kinds[] = {"bandwidth", "config", "latency"};
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s.%s", dir, host, kinds[i]);
		if (access(path, R_OK))
			return 0;
	}
	return 1;
}

/* StarPU measures the buses on its first start on a host and writes them
 * to its home; two processes of one host that both find nothing there
 * measure together, and one reads a file that the other has just
 * truncated: StarPU 1.3 aborts ("Error when reading from file
 * .../bus/HOST.affinity"; seen with 2 ranks per host on a fresh home). So
 * on a node's first start the node's first rank starts and stops StarPU
 * alone, with the same workers, and the node's other ranks wait for it. */
static int calibrate_bus_once(const rmoe_ctx *ctx, const struct starpu_conf *conf)
{
	if (ctx->local_size < 2)
		return 0;
	int missing = ctx->local_rank == 0 ? !bus_calibrated() : 0;
	MPI_Bcast(&missing, 1, MPI_INT, 0, ctx->node);
	if (missing) {
		if (ctx->local_rank == 0) {
			if (!getenv("STARPU_SILENT"))
				fprintf(stderr, "relaymoe: rank %d measures this host's buses for StarPU alone (its first start "
				        "here); the node's %d other rank(s) start after it\n", ctx->rank, ctx->local_size - 1);
			/* This start leaves no trace file and prints no statistics:
			 * those are the real start's. */
			static const char *const quiet[] = {"STARPU_FXT_TRACE", "STARPU_WORKER_STATS", "STARPU_BUS_STATS",
			                                    "STARPU_MEMORY_STATS", "STARPU_PROFILING"};
			enum { NQUIET = sizeof(quiet) / sizeof(quiet[0]) };
			char *saved[NQUIET];
			for (int i = 0; i < NQUIET; i++) {
				const char *v = getenv(quiet[i]);
				saved[i] = v ? strdup(v) : NULL;
				setenv(quiet[i], "0", 1);
			}
			struct starpu_conf once = *conf;
			/* A failure here is the real start's to report, with its message. */
			if (starpu_init(&once) == 0)
				starpu_shutdown();
			for (int i = 0; i < NQUIET; i++) {
				if (saved[i])
					setenv(quiet[i], saved[i], 1);
				else
					unsetenv(quiet[i]);
				free(saved[i]);
			}
		}
		MPI_Barrier(ctx->node);
	}
	return 0;
}
#endif

/* StarPU and StarPU-MPI on the context's communicator. */
static int ctx_starpu(rmoe_ctx *ctx, const struct rmoe_ctx_config *cfg)
{
	int rc = check_policy(cfg);
	if (rc)
		return rc;
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	if (cfg->ncpus > 0)
		conf.ncpus = cfg->ncpus;
	else if (!getenv("STARPU_NCPU"))
		conf.ncpus = auto_ncpus(ctx->local_size);
	conf.ncuda = cfg->ncuda;
	if (cfg->sched)
		conf.sched_policy_name = cfg->sched;
	/* StarPU binds every rank's first worker to core 0 by default: with
	 * several ranks on a node they would all share one core. */
	if (ctx->local_size > 1)
		setenv("STARPU_WORKERS_NOBIND", "1", 0);
#ifndef STARPU_SIMGRID
	if ((rc = calibrate_bus_once(ctx, &conf)))
		return rc;
#else
	/* StarPU charges every simulated cudaMalloc and pinned host allocation
	 * (175 us, 650 us per MiB); the frameworks the paper compares reuse
	 * device memory through a caching allocator, whose steady state costs
	 * nothing. STARPU_SIMGRID_CUDA_MALLOC_COST=1 restores StarPU's model. */
	setenv("STARPU_SIMGRID_CUDA_MALLOC_COST", "0", 0);
#endif
	/* Before StarPU allocates anything: every main-memory buffer it frees
	 * must come from the cache's hooks (codelets/host_cache.c). Not beside
	 * CUDA workers, whose pinned host memory StarPU allocates itself. */
#ifdef STARPU_USE_CUDA
	const int may_pin = conf.ncuda != 0;
#else
	const int may_pin = 0;
#endif
	if (!may_pin) {
		if ((rc = rmoe_host_cache_install(getenv("RMOE_HOST_CACHE"))))
			return rc;
		ctx->host_cache = 1;
	}
	int ret = starpu_mpi_init_conf(NULL, NULL, 0, ctx->comm, &conf);
	if (ret == -ENODEV)
		return rmoe_error(RMOE_ESTARPU, "StarPU found no worker to run on (ncpus=%d, ncuda=%d)", conf.ncpus,
		                  conf.ncuda);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_mpi_init_conf failed (%d)", ret);
	ctx->started_starpu_mpi = 1;
#ifdef STARPU_SIMGRID
	/* Simulated data carries nothing: StarPU's own buffers in main memory
	 * (temporaries, transfers staged through the host) are folded too, as
	 * the layer's are (layer.c). Not pinned: see the allocation cost above. */
	starpu_malloc_on_node_set_default_flags(STARPU_MAIN_RAM, STARPU_MALLOC_COUNT | STARPU_MALLOC_SIMULATION_FOLDED);
#endif
	return 0;
}

/* The tag window: the upper half of what StarPU-MPI accepts, so that an
 * application sharing StarPU-MPI's communicator keeps the lower half. */
static void ctx_tags(rmoe_ctx *ctx)
{
	int64_t *ub = NULL;
	int ubflag = 0;
	starpu_mpi_comm_get_attr(ctx->comm, STARPU_MPI_TAG_UB, &ub, &ubflag);
	int64_t tag_ub = (ubflag && ub) ? *ub : 32767; /* the MPI standard's guaranteed minimum */
	ctx->tag_first = tag_ub / 2;
	ctx->tag_last = tag_ub;
	ctx->tag_next = ctx->tag_first;
}

/* Stops what the context started, in reverse; a trace is converted first
 * (StarPU's shutdown has written this rank's file). */
static int ctx_unwind(rmoe_ctx *ctx)
{
	if (ctx->codelets_started)
		rmoe_codelets_stop();
	if (ctx->started_starpu_mpi)
		starpu_mpi_shutdown();
	else if (starpu_is_initialized())
		starpu_task_wait_for_all();
	if (ctx->host_cache)
		rmoe_host_cache_uninstall();
	int rc = rmoe_trace_finish(ctx);
	if (ctx->node != MPI_COMM_NULL)
		MPI_Comm_free(&ctx->node);
	if (ctx->dup_comm)
		MPI_Comm_free(&ctx->comm);
	if (ctx->started_mpi)
		MPI_Finalize();
	rmoe_topology_free(&ctx->topo);
	free(ctx->ring);
	free(ctx);
	return rc;
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
		return rmoe_error(RMOE_EINVAL, "ctx ncpus = %d: expected 0 (automatic) or a positive count", cfg.ncpus);
	if (cfg.blas_threads < 0)
		return rmoe_error(RMOE_EINVAL, "ctx blas_threads = %d: expected 0 (automatic) or a positive count",
		                  cfg.blas_threads);
	if (cfg.ncuda < -1)
		return rmoe_error(RMOE_EINVAL, "ctx ncuda = %d: expected -1 (all), 0 or a positive count", cfg.ncuda);
	rmoe_ctx *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return rmoe_error(RMOE_ENOMEM, "rmoe_ctx_create: out of host memory");
	ctx->verbose = cfg.verbose;
	ctx->node = MPI_COMM_NULL;
	const int starpu_running = starpu_is_initialized();
	int rc = ctx_mpi(ctx, comm, starpu_running);
	if (!rc)
		rc = rmoe_agree(ctx->comm, rmoe_trace_prepare(ctx, cfg.trace, starpu_running), "to set up the trace");
	if (!rc && !starpu_running)
		rc = ctx_starpu(ctx, &cfg);
	if (rc) {
		/* A trace prepared on this rank was refused by another: no merge. */
		rmoe_trace_release(ctx);
		ctx_unwind(ctx);
		return rc;
	}
	if ((rc = rmoe_agree(ctx->comm, rmoe_codelets_init(), "to set up the codelets"))) {
		rmoe_ctx_destroy(ctx);
		return rc;
	}
	ctx->blas_threads =
	        rmoe_codelets_blas_threads(cfg.blas_threads > 0 ? cfg.blas_threads : auto_blas_threads(ctx->local_size));
	const char *advice = rmoe_blas_core_advice();
	if (advice && ctx->rank == 0)
		fprintf(stderr, "relaymoe: OpenBLAS runs its %s kernels on a CPU with wider vectors: start the program "
		        "with OPENBLAS_CORETYPE=%s in its environment for GEMMs several times faster\n",
		        rmoe_blas_core(), advice);
	if (ctx->verbose)
		fprintf(stderr, "relaymoe: rank %d: %u CPU worker(s), %d OpenBLAS thread(s) per call%s\n", ctx->rank,
		        starpu_cpu_worker_get_count(), ctx->blas_threads,
		        cfg.blas_threads > 0 ? "" : " (automatic)");
	rmoe_codelets_start();
	ctx->codelets_started = 1;
	if ((rc = plan_ring(ctx, &cfg))) {
		rmoe_ctx_destroy(ctx);
		return rc;
	}
	ctx_tags(ctx);
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
	return ctx_unwind(ctx);
}
