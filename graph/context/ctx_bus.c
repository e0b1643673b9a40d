/* StarPU's bus calibration on a node's first start, measured by one rank
 * of the node alone (the workaround below says why). Not in the
 * simulation, whose buses are the platform's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <starpu.h>

#include "rmoe_ctx.h"

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
int rmoe_ctx_calibrate_bus_once(const rmoe_ctx *ctx, const struct starpu_conf *conf)
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
