/* The programs' messages and their vote over the ranks (messages.h). */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "messages.h"
#include "relaymoe/relaymoe.h"

int rmoe_app_agree(int rc)
{
	/* A peer is gone (the layer's wait timeout expired): a collective would
	 * wait for it forever, and the context can no longer be shut down, so
	 * the process ends here, without MPI_Abort: that has Open MPI kill
	 * every rank at once, before the others can say which peer they were
	 * waiting for. The first rank to end has mpirun end the others; the
	 * ranks stalled by one lost peer start waiting within about a pass of
	 * each other (longer on a loaded machine), so each waits out one more
	 * wait timeout (RMOE_WAIT_TIMEOUT, 1 to 10 s) before it ends, and all
	 * report. Nothing was written yet: --dump and --csv come after the
	 * passes. */
	if (rc == RMOE_EPEER) {
		rmoe_app_error("%s; ending this process", rmoe_strerror(rc));
		fflush(NULL);
		/* RMOE_WAIT_TIMEOUT as the layer's configuration reads it */
		struct rmoe_layer_config cfg;
		rmoe_layer_config_init(&cfg);
		const double grace = cfg.wait_timeout;
		sleep(grace >= 10.0 ? 10u : grace >= 1.0 ? (unsigned)grace : 1u);
		_exit(3);
	}
	int worst = rc;
	MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	return worst;
}

void rmoe_app_say(const char *fmt, ...)
{
	int rank = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank != 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
}

void rmoe_app_error(const char *fmt, ...)
{
	int rank = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "relaymoe: rank %d: %s\n", rank, line);
	fflush(stderr);
}
