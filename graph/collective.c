/* Bounded waits and rank agreement (rmoe_collective.h).
 *
 * A rank that dies leaves the others waiting for its data or its vote, and
 * with a launcher that does not end the job on a death (Open MPI's mpirun
 * does, by default), forever. With a timeout every wait of a collective call
 * polls instead and gives up with RMOE_EPEER. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rmoe_collective.h"
#include "rmoe_scheduler.h"

static _Thread_local double wait_timeout;

void rmoe_wait_timeout_set(double seconds)
{
	wait_timeout = seconds > 0 && isfinite(seconds) ? seconds : 0;
}

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Polls start at 20 us and double up to 1 ms: short waits stay short, long
 * ones cost little. */
static void poll_pause(long *ns)
{
	struct timespec ts = {0, *ns};
	nanosleep(&ts, NULL);
	if (*ns < 1000000)
		*ns *= 2;
}

static int peer_timeout(const char *what)
{
	return rmoe_error(RMOE_EPEER,
	                  "no progress for %g s (wait_timeout) while waiting for %s: another rank died, "
	                  "hangs or stopped calling the layer, or a task here cannot get memory (StarPU "
	                  "1.3 retries forever); this process must end (MPI_Abort)",
	                  wait_timeout, what);
}

struct acquire_flag {
	atomic_int done;
};

static void acquire_done(void *arg)
{
	atomic_store(&((struct acquire_flag *)arg)->done, 1);
}

int rmoe_acquire_bounded(starpu_data_handle_t h, int node, enum starpu_data_access_mode mode, const char *what)
{
	int ret;
	if (wait_timeout <= 0) {
		ret = starpu_data_acquire_on_node(h, node, mode);
		return ret ? rmoe_error(RMOE_ESTARPU, "starpu_data_acquire (%s) failed (%d)", what, ret) : 0;
	}
	/* On RMOE_EPEER the flag is left to the callback, which may still run. */
	struct acquire_flag *flag = calloc(1, sizeof(*flag));
	if (!flag)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	ret = starpu_data_acquire_on_node_cb(h, node, mode, acquire_done, flag);
	if (ret) {
		free(flag);
		return rmoe_error(RMOE_ESTARPU, "starpu_data_acquire_cb (%s) failed (%d)", what, ret);
	}
	double t0 = now_seconds();
	for (long ns = 20000; !atomic_load(&flag->done); poll_pause(&ns))
		if (now_seconds() - t0 > wait_timeout)
			return peer_timeout(what);
	free(flag);
	return 0;
}

int rmoe_wait_data(starpu_data_handle_t h)
{
	/* Waits for the data's writers (a receive, a task) without fetching
	 * it anywhere: on a GPU it stays on the device. */
	int rc = rmoe_acquire_bounded(h, STARPU_ACQUIRE_NO_NODE, STARPU_R, "data from another rank");
	if (rc)
		return rc;
	starpu_data_release_on_node(h, STARPU_ACQUIRE_NO_NODE);
	return 0;
}

int rmoe_wait_tasks(const char *what)
{
	if (wait_timeout <= 0) {
		starpu_task_wait_for_all();
		return 0;
	}
	double t0 = now_seconds();
	for (long ns = 20000; starpu_task_nsubmitted() > 0; poll_pause(&ns))
		if (now_seconds() - t0 > wait_timeout)
			return peer_timeout(what);
	return 0;
}

/* Completes a non-blocking collective within the timeout. On RMOE_EPEER the
 * request is abandoned: it cannot complete without the missing rank. */
static int complete_bounded(int started, MPI_Request *req, const char *call, const char *what)
{
	if (started != MPI_SUCCESS)
		return rmoe_error(RMOE_EMPI, "%s failed while %s", call, what);
	double t0 = now_seconds();
	for (long ns = 20000;; poll_pause(&ns)) {
		int done = 0;
		if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
			return rmoe_error(RMOE_EMPI, "MPI_Test of %s failed while %s", call, what);
		if (done)
			return 0;
		if (now_seconds() - t0 > wait_timeout)
			return peer_timeout(what);
	}
}

/* Without a timeout the blocking collectives; with one their non-blocking
 * forms, polled. */
int rmoe_allreduce_bounded(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                           const char *what)
{
	MPI_Request req;
	if (wait_timeout <= 0)
		return MPI_Allreduce(in, out, count, type, op, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Allreduce failed while %s", what);
	return complete_bounded(MPI_Iallreduce(in, out, count, type, op, comm, &req), &req, "MPI_Iallreduce", what);
}

int rmoe_bcast_bounded(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm, const char *what)
{
	MPI_Request req;
	if (wait_timeout <= 0)
		return MPI_Bcast(buf, count, type, root, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Bcast failed while %s", what);
	return complete_bounded(MPI_Ibcast(buf, count, type, root, comm, &req), &req, "MPI_Ibcast", what);
}

int rmoe_allgather_bounded(const void *in, void *out, int count, MPI_Datatype type, MPI_Comm comm,
                           const char *what)
{
	MPI_Request req;
	if (wait_timeout <= 0)
		return MPI_Allgather(in, count, type, out, count, type, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Allgather failed while %s", what);
	return complete_bounded(MPI_Iallgather(in, count, type, out, count, type, comm, &req), &req,
	                        "MPI_Iallgather", what);
}

int rmoe_agree(MPI_Comm comm, int rc, const char *what)
{
	/* A peer already missing would only make the vote wait again. */
	if (rc == RMOE_EPEER)
		return rc;
	int worst = rc;
	int mrc = rmoe_allreduce_bounded(&rc, &worst, 1, MPI_INT, MPI_MIN, comm, what);
	if (mrc)
		return mrc;
	if (rc != 0)
		return rc;
	if (worst != 0)
		return rmoe_error(worst, "another rank failed %s: %s", what, rmoe_strerror(worst));
	return 0;
}

int rmoe_agree_first(MPI_Comm comm, int rc, const char *what)
{
	if (rc == RMOE_EPEER)
		return rc;
	int rank = 0, size = 1;
	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	int mine = rc ? rank : size, first = mine;
	int mrc = rmoe_allreduce_bounded(&mine, &first, 1, MPI_INT, MPI_MIN, comm, what);
	if (mrc)
		return mrc;
	if (first == size)
		return 0;
	struct {
		int code;
		char msg[400];
	} verdict;
	memset(&verdict, 0, sizeof(verdict));
	if (first == rank) {
		verdict.code = rc;
		snprintf(verdict.msg, sizeof(verdict.msg), "%s", rmoe_strerror(rc));
	}
	mrc = rmoe_bcast_bounded(&verdict, (int)sizeof(verdict), MPI_BYTE, first, comm, what);
	if (mrc)
		return mrc;
	verdict.msg[sizeof(verdict.msg) - 1] = '\0';
	return rmoe_error(verdict.code, "rank %d: %s", first, verdict.msg);
}

int rmoe_agree_digest(MPI_Comm comm, uint64_t digest, const char *what)
{
	uint64_t lo = digest, hi = digest;
	int mrc = rmoe_allreduce_bounded(&digest, &lo, 1, MPI_UINT64_T, MPI_MIN, comm, what);
	if (!mrc)
		mrc = rmoe_allreduce_bounded(&digest, &hi, 1, MPI_UINT64_T, MPI_MAX, comm, what);
	if (mrc)
		return mrc;
	return lo == hi;
}
