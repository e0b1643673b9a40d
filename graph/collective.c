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
/* Host waits made on this thread (rmoe_wait_count). */
static _Thread_local int64_t host_waits;
/* The ranks that had not reached the last collective that timed out on this
 * thread (rmoe_wait_missing); -1 when the last timeout was another wait's. */
static _Thread_local int missing_count = -1;
static _Thread_local int missing_ranks[RMOE_WAIT_MISSING_MAX];

void rmoe_wait_timeout_set(double seconds)
{
	wait_timeout = seconds > 0 && isfinite(seconds) ? seconds : 0;
}

int64_t rmoe_wait_count(void)
{
	return host_waits;
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
	missing_count = -1;
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
	host_waits++;
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
	host_waits++;
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

/* Who reached a collective, and can be heard. One that times out cannot
 * say which rank is missing, so with a timeout each rank, before joining
 * it, sends every other rank an empty "arrived" message, and answers each
 * one it gets with an empty "heard" message (on the communicator's two
 * highest tags; StarPU-MPI's own messages use tags 42 to 44). When the wait
 * gives up, the ranks that never answered are the ones lost, stuck before
 * the collective, or cut off from this one (a rank whose own "arrived" went
 * out before a link failed hears the others, but they cannot answer).
 * 2 (N - 1) empty messages from each rank per collective, with a timeout only. */
enum { ARRIVED_RECV, HEARD_RECV, ARRIVED_SEND, HEARD_SEND, NREQ };

struct arrivals {
	MPI_Comm comm;
	int tag;                   /* "arrived"; tag - 1: "heard" */
	int n;                     /* peers */
	int *peer;                 /* [n] */
	MPI_Request *req;          /* [NREQ * n]: req[k * n + i] for peer i */
	char *answered;            /* [n]: this rank has sent peer i its "heard" */
};

static void arrivals_free(struct arrivals *a, int abandon)
{
	/* Requests that cannot complete are abandoned with their memory. */
	if (!abandon)
		free(a->req);
	free(a->peer);
	free(a->answered);
	*a = (struct arrivals){0};
}

static int arrivals_post(MPI_Comm comm, struct arrivals *a, const char *what)
{
	int rank = 0, size = 1, found = 0, *tag_ub = NULL;
	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	memset(a, 0, sizeof(*a));
	if (size < 2)
		return 0;
	MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &found);
	a->comm = comm;
	a->tag = found && tag_ub ? *tag_ub : 32767;
	size_t n = (size_t)(size - 1);
	a->peer = malloc(sizeof(int) * n);
	a->req = malloc(sizeof(MPI_Request) * NREQ * n);
	a->answered = calloc(n, 1);
	if (!a->peer || !a->req || !a->answered) {
		arrivals_free(a, 0);
		return rmoe_error(RMOE_ENOMEM, "out of host memory while %s", what);
	}
	for (int q = 0; q < size; q++)
		if (q != rank)
			a->peer[a->n++] = q;
	int bad = 0;
	for (int i = 0; i < a->n; i++) {
		a->req[HEARD_SEND * a->n + i] = MPI_REQUEST_NULL;
		bad |= MPI_Irecv(NULL, 0, MPI_BYTE, a->peer[i], a->tag, comm, &a->req[ARRIVED_RECV * a->n + i]);
		bad |= MPI_Irecv(NULL, 0, MPI_BYTE, a->peer[i], a->tag - 1, comm, &a->req[HEARD_RECV * a->n + i]);
		bad |= MPI_Isend(NULL, 0, MPI_BYTE, a->peer[i], a->tag, comm, &a->req[ARRIVED_SEND * a->n + i]);
	}
	return bad ? rmoe_error(RMOE_EMPI, "MPI_Isend or MPI_Irecv failed while %s", what) : 0;
}

/* Answers the peers whose "arrived" came; 1 once every message of the
 * exchange is done. */
static int arrivals_progress(struct arrivals *a)
{
	int all = 1;
	for (int i = 0; i < a->n; i++) {
		int got = 0;
		if (a->answered[i])
			continue;
		MPI_Test(&a->req[ARRIVED_RECV * a->n + i], &got, MPI_STATUS_IGNORE);
		if (got) {
			MPI_Isend(NULL, 0, MPI_BYTE, a->peer[i], a->tag - 1, a->comm, &a->req[HEARD_SEND * a->n + i]);
			a->answered[i] = 1;
		}
		all = all && a->answered[i];
	}
	/* Not before every peer is answered: the test of all requests could
	 * complete an "arrived" that this loop has not answered yet. */
	int done = 0;
	if (all)
		MPI_Testall(NREQ * a->n, a->req, &done, MPI_STATUSES_IGNORE);
	return done;
}

/* The timeout of a collective, naming the ranks that never answered. */
static int arrivals_timeout(struct arrivals *a, const char *what)
{
	int n = 0;
	char list[160] = "";
	size_t used = 0;
	for (int i = 0; i < a->n; i++) {
		int heard = 0;
		MPI_Test(&a->req[HEARD_RECV * a->n + i], &heard, MPI_STATUS_IGNORE);
		if (heard)
			continue;
		if (n < RMOE_WAIT_MISSING_MAX)
			missing_ranks[n] = a->peer[i];
		if (used < sizeof(list) - 16)
			used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%d", n ? ", " : "", a->peer[i]);
		n++;
	}
	arrivals_free(a, 1);
	int rc = rmoe_error(RMOE_EPEER,
	                    "no progress for %g s (wait_timeout) while waiting for %s: %s%s%s; another rank died, "
	                    "hangs or stopped calling the layer, or a task there cannot get memory (StarPU 1.3 "
	                    "retries forever); this process must end (MPI_Abort)",
	                    wait_timeout, what, n ? "no answer from rank(s) " : "every rank answered, yet the "
	                    "collective did not complete", n ? list : "", used >= sizeof(list) - 16 ? ", ..." : "");
	missing_count = n < RMOE_WAIT_MISSING_MAX ? n : RMOE_WAIT_MISSING_MAX;
	return rc;
}

int rmoe_wait_missing(int *ranks, int max)
{
	int n = missing_count < max ? missing_count : max;
	if (n > 0)
		memcpy(ranks, missing_ranks, sizeof(int) * (size_t)n);
	return missing_count;
}

/* Completes a non-blocking collective within the timeout, with the ranks'
 * arrivals. On RMOE_EPEER the requests are abandoned: they cannot complete
 * without the missing rank. */
static int complete_bounded(int started, MPI_Request *req, struct arrivals *a, const char *call,
                            const char *what)
{
	if (started != MPI_SUCCESS) {
		arrivals_free(a, 1);
		return rmoe_error(RMOE_EMPI, "%s failed while %s", call, what);
	}
	double t0 = now_seconds();
	int done = 0, exchanged = a->n == 0;
	for (long ns = 20000;; poll_pause(&ns)) {
		if (!done && MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
			arrivals_free(a, 1);
			return rmoe_error(RMOE_EMPI, "MPI_Test of %s failed while %s", call, what);
		}
		if (!exchanged)
			exchanged = arrivals_progress(a);
		if (done && exchanged) {
			arrivals_free(a, 0);
			return 0;
		}
		if (now_seconds() - t0 > wait_timeout)
			return arrivals_timeout(a, what);
	}
}

/* Without a timeout the blocking collectives; with one their non-blocking
 * forms, polled. */
int rmoe_allreduce_bounded(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                           const char *what)
{
	MPI_Request req;
	struct arrivals a;
	host_waits++;
	if (wait_timeout <= 0)
		return MPI_Allreduce(in, out, count, type, op, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Allreduce failed while %s", what);
	int rc = arrivals_post(comm, &a, what);
	if (rc)
		return rc;
	return complete_bounded(MPI_Iallreduce(in, out, count, type, op, comm, &req), &req, &a, "MPI_Iallreduce",
	                        what);
}

int rmoe_bcast_bounded(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm, const char *what)
{
	MPI_Request req;
	struct arrivals a;
	host_waits++;
	if (wait_timeout <= 0)
		return MPI_Bcast(buf, count, type, root, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Bcast failed while %s", what);
	int rc = arrivals_post(comm, &a, what);
	if (rc)
		return rc;
	return complete_bounded(MPI_Ibcast(buf, count, type, root, comm, &req), &req, &a, "MPI_Ibcast", what);
}

int rmoe_allgather_bounded(const void *in, void *out, int count, MPI_Datatype type, MPI_Comm comm,
                           const char *what)
{
	MPI_Request req;
	struct arrivals a;
	host_waits++;
	if (wait_timeout <= 0)
		return MPI_Allgather(in, count, type, out, count, type, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Allgather failed while %s", what);
	int rc = arrivals_post(comm, &a, what);
	if (rc)
		return rc;
	return complete_bounded(MPI_Iallgather(in, count, type, out, count, type, comm, &req), &req, &a,
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
