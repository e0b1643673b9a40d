/* FxT traces of a context (rmoe_ctx_config.trace): the folder and the
 * environment StarPU reads before it starts, and the merge and conversion of
 * every rank's file on rank 0 once StarPU has written them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <starpu.h>

#include "rmoe_config.h"
#include "rmoe_ctx.h"
#include "rmoe_system.h"

/* StarPU reads its FxT settings from the environment when it starts, so only
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
int rmoe_trace_prepare(rmoe_ctx *ctx, const char *dir, int starpu_running)
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
void rmoe_trace_release(const rmoe_ctx *ctx)
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

int rmoe_trace_finish(rmoe_ctx *ctx)
{
	int rc = 0;
	if (tracing.owner != ctx)
		return 0;
#ifdef RMOE_STARPU_HAS_FXT
	/* starpu_shutdown has written each rank's file: wait for all of them. */
	if (MPI_Barrier(ctx->comm) != MPI_SUCCESS)
		rc = rmoe_error(RMOE_EMPI, "MPI_Barrier failed before converting the trace");
	else if (ctx->rank == 0)
		rc = trace_convert(ctx, tracing.dir);
#endif
	rmoe_trace_release(ctx);
	return rc;
}
