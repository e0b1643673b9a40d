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

struct rmoe_wait rmoe_wait_make(double timeout)
{
	return (struct rmoe_wait){.timeout = timeout > 0 && isfinite(timeout) ? timeout : 0, .nmissing = -1};
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

static int peer_timeout(struct rmoe_wait *w, const char *what)
{
	w->nmissing = -1;
	return rmoe_error(RMOE_EPEER,
	                  "no progress for %g s (wait_timeout) while waiting for %s: another rank died, "
	                  "hangs or stopped calling the layer, or a task here cannot get memory (StarPU "
	                  "1.3 retries forever); this process must end (MPI_Abort)",
	                  w->timeout, what);
}

struct acquire_flag {
	atomic_int done;
};

static void acquire_done(void *arg)
{
	atomic_store(&((struct acquire_flag *)arg)->done, 1);
}

int rmoe_acquire_bounded(struct rmoe_wait *w, starpu_data_handle_t h, int node, enum starpu_data_access_mode mode, const char *what)
{
	int ret;
	w->count++;
	if (w->timeout <= 0) {
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
		if (now_seconds() - t0 > w->timeout)
			return peer_timeout(w, what);
	free(flag);
	return 0;
}

int rmoe_wait_data(struct rmoe_wait *w, starpu_data_handle_t h)
{
	/* Waits for the data's writers (a receive, a task) without fetching
	 * it anywhere: on a GPU it stays on the device. */
	int rc = rmoe_acquire_bounded(w, h, STARPU_ACQUIRE_NO_NODE, STARPU_R, "data from another rank");
	if (rc)
		return rc;
	starpu_data_release_on_node(h, STARPU_ACQUIRE_NO_NODE);
	return 0;
}

int rmoe_wait_tasks(struct rmoe_wait *w, const char *what)
{
	w->count++;
	if (w->timeout <= 0) {
		starpu_task_wait_for_all();
		return 0;
	}
	double t0 = now_seconds();
	for (long ns = 20000; starpu_task_nsubmitted() > 0; poll_pause(&ns))
		if (now_seconds() - t0 > w->timeout)
			return peer_timeout(w, what);
	return 0;
}

/* Collectives with a timeout are made of point-to-point messages: each rank
 * sends its contribution straight to every rank that needs it (on the
 * communicator's highest tag; StarPU-MPI's own messages use tags 42 to 44)
 * and waits for those it needs itself. One that gives up then knows exactly
 * whose contribution it lacks, or which peer never took its own: the ranks
 * it waited for, lost, stuck before the collective, or cut off from this
 * one. An MPI collective cannot say that: when a link fails inside it, some
 * ranks complete it and go on while others wait for a message that will
 * never come, from a rank they cannot name. N - 1 small messages from each
 * rank per collective (a vote is a few integers), with a timeout only. */
struct exchange {
	int rank, size;
	MPI_Aint extent;          /* bytes of one contribution */
	MPI_Request *recv, *send; /* [size]; MPI_REQUEST_NULL where none */
	char *inbox;              /* [size * extent]: rank r's contribution at r,
	                           * this rank's the one its sends read */
	struct parked *block;     /* the one allocation holding the above */
};

/* An exchange's allocation starts with this header: one given up on stays
 * on a list, reachable, until the process ends (which it must after
 * RMOE_EPEER), since MPI may still write into it (a late rank's
 * contribution). */
struct parked {
	struct parked *next;
};
static _Atomic(struct parked *) parked;

static void exchange_free(struct exchange *x, int abandon)
{
	struct parked *p = x->block;
	if (p && abandon) {
		p->next = atomic_load(&parked);
		while (!atomic_compare_exchange_weak(&parked, &p->next, p))
			;
	} else {
		free(p);
	}
	*x = (struct exchange){0};
}

/* Posts the messages: this rank's contribution (mine; NULL: none) to every
 * other rank, and receives from every other rank (from < 0) or from rank
 * `from` only (itself: none). */
static int exchange_post(struct exchange *x, const void *mine, int from, int count, MPI_Datatype type,
                         MPI_Comm comm, const char *what)
{
	int found = 0, *tag_ub = NULL;
	MPI_Aint lb = 0, extent = 0;
	memset(x, 0, sizeof(*x));
	MPI_Comm_rank(comm, &x->rank);
	MPI_Comm_size(comm, &x->size);
	MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &found);
	MPI_Type_get_extent(type, &lb, &extent);
	int tag = found && tag_ub ? *tag_ub : 32767;
	x->extent = extent * count;
	size_t n = (size_t)x->size;
	x->block = malloc(sizeof(struct parked) + sizeof(MPI_Request) * 2 * n + (size_t)x->extent * n);
	if (!x->block)
		return rmoe_error(RMOE_ENOMEM, "out of host memory while %s", what);
	x->recv = (MPI_Request *)(x->block + 1);
	x->send = x->recv + n;
	x->inbox = (char *)(x->send + n);
	char *own = x->inbox + (size_t)x->rank * (size_t)x->extent;
	if (mine)
		memcpy(own, mine, (size_t)x->extent);
	int bad = 0;
	for (int q = 0; q < x->size; q++) {
		x->recv[q] = x->send[q] = MPI_REQUEST_NULL;
		if (q == x->rank)
			continue;
		if (from < 0 || from == q)
			bad |= MPI_Irecv(x->inbox + (size_t)q * (size_t)x->extent, count, type, q, tag, comm, &x->recv[q]);
		if (mine)
			bad |= MPI_Isend(own, count, type, q, tag, comm, &x->send[q]);
	}
	if (!bad)
		return 0;
	exchange_free(x, 1);
	return rmoe_error(RMOE_EMPI, "MPI_Isend or MPI_Irecv failed while %s", what);
}

/* Waits within the timeout until every message of the exchange is done; on
 * RMOE_EPEER its requests are abandoned (they cannot complete without the
 * missing rank) and rmoe_wait_missing names the peers whose contribution
 * never came or who never took this rank's. */
static int exchange_complete(struct rmoe_wait *w, struct exchange *x, const char *what)
{
	double t0 = now_seconds();
	int n = 2 * x->size;
	for (long ns = 20000;; poll_pause(&ns)) {
		/* One by one: MPI_Test frees each completed request (sets it to
		 * MPI_REQUEST_NULL), where an incomplete MPI_Testall leaves all. */
		int pending = 0;
		for (int i = 0; i < n; i++) {
			int done = 1;
			if (x->recv[i] != MPI_REQUEST_NULL && MPI_Test(&x->recv[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
				exchange_free(x, 1);
				return rmoe_error(RMOE_EMPI, "MPI_Test failed while %s", what);
			}
			pending += !done;
		}
		if (!pending)
			return 0;
		if (now_seconds() - t0 > w->timeout)
			break;
	}
	int m = 0;
	char list[160] = "";
	size_t used = 0;
	for (int q = 0; q < x->size; q++) {
		if (x->recv[q] == MPI_REQUEST_NULL && x->send[q] == MPI_REQUEST_NULL)
			continue;
		if (m < RMOE_WAIT_MISSING_MAX)
			w->missing[m] = q;
		if (used < sizeof(list) - 16)
			used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%d", m ? ", " : "", q);
		m++;
	}
	exchange_free(x, 1);
	int rc = rmoe_error(RMOE_EPEER,
	                    "no progress for %g s (wait_timeout) while waiting for %s: no answer from rank(s) %s%s; "
	                    "another rank died, hangs or stopped calling the layer, or a task there cannot get "
	                    "memory (StarPU 1.3 retries forever); this process must end (MPI_Abort)",
	                    w->timeout, what, list, used >= sizeof(list) - 16 ? ", ..." : "");
	w->nmissing = m < RMOE_WAIT_MISSING_MAX ? m : RMOE_WAIT_MISSING_MAX;
	return rc;
}

int rmoe_wait_missing(const struct rmoe_wait *w, int *ranks, int max)
{
	int n = w->nmissing < max ? w->nmissing : max;
	if (n > 0)
		memcpy(ranks, w->missing, sizeof(int) * (size_t)n);
	return w->nmissing;
}

/* Without a timeout the blocking collectives; with one the exchange above.
 * The reduction runs in rank order on every rank, so that every rank gets
 * the same bits, floating-point sums included. */
int rmoe_allreduce_bounded(struct rmoe_wait *w, const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                           const char *what)
{
	struct exchange x;
	w->count++;
	if (w->timeout <= 0)
		return MPI_Allreduce(in, out, count, type, op, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Allreduce failed while %s", what);
	int rc = exchange_post(&x, in, -1, count, type, comm, what);
	if (rc || (rc = exchange_complete(w, &x, what)))
		return rc;
	size_t bytes = (size_t)x.extent;
	/* MPI_Reduce_local(a, b) makes b = a op b: from the last rank down. */
	memcpy(out, x.inbox + (size_t)(x.size - 1) * bytes, bytes);
	int bad = 0;
	for (int q = x.size - 2; q >= 0; q--)
		bad |= MPI_Reduce_local(x.inbox + (size_t)q * bytes, out, count, type, op);
	exchange_free(&x, 0);
	return bad ? rmoe_error(RMOE_EMPI, "MPI_Reduce_local failed while %s", what) : 0;
}

int rmoe_bcast_bounded(struct rmoe_wait *w, void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm, const char *what)
{
	struct exchange x;
	int rank = 0;
	w->count++;
	if (w->timeout <= 0)
		return MPI_Bcast(buf, count, type, root, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Bcast failed while %s", what);
	MPI_Comm_rank(comm, &rank);
	int rc = exchange_post(&x, rank == root ? buf : NULL, root, count, type, comm, what);
	if (rc || (rc = exchange_complete(w, &x, what)))
		return rc;
	if (rank != root)
		memcpy(buf, x.inbox + (size_t)root * (size_t)x.extent, (size_t)x.extent);
	exchange_free(&x, 0);
	return 0;
}

int rmoe_allgather_bounded(struct rmoe_wait *w, const void *in, void *out, int count, MPI_Datatype type, MPI_Comm comm,
                           const char *what)
{
	struct exchange x;
	w->count++;
	if (w->timeout <= 0)
		return MPI_Allgather(in, count, type, out, count, type, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Allgather failed while %s", what);
	int rc = exchange_post(&x, in, -1, count, type, comm, what);
	if (rc || (rc = exchange_complete(w, &x, what)))
		return rc;
	memcpy(out, x.inbox, (size_t)x.extent * (size_t)x.size);
	exchange_free(&x, 0);
	return 0;
}

int rmoe_agree(struct rmoe_wait *w, MPI_Comm comm, int rc, const char *what)
{
	/* A peer already missing would only make the vote wait again. */
	if (rc == RMOE_EPEER)
		return rc;
	int worst = rc;
	int mrc = rmoe_allreduce_bounded(w, &rc, &worst, 1, MPI_INT, MPI_MIN, comm, what);
	if (mrc)
		return mrc;
	if (rc != 0)
		return rc;
	if (worst != 0)
		return rmoe_error(worst, "another rank failed %s: %s", what, rmoe_strerror(worst));
	return 0;
}

/* The lowest failing rank's code and message, sent to every rank. */
static int first_verdict(struct rmoe_wait *w, MPI_Comm comm, int rank, int first, int rc, const char *what)
{
	struct {
		int code;
		char msg[400];
	} verdict;
	memset(&verdict, 0, sizeof(verdict));
	if (first == rank) {
		verdict.code = rc;
		snprintf(verdict.msg, sizeof(verdict.msg), "%s", rmoe_strerror(rc));
	}
	int mrc = rmoe_bcast_bounded(w, &verdict, (int)sizeof(verdict), MPI_BYTE, first, comm, what);
	if (mrc)
		return mrc;
	verdict.msg[sizeof(verdict.msg) - 1] = '\0';
	return rmoe_error(verdict.code, "rank %d: %s", first, verdict.msg);
}

int rmoe_agree_first(struct rmoe_wait *w, MPI_Comm comm, int rc, const char *what)
{
	if (rc == RMOE_EPEER)
		return rc;
	int rank = 0, size = 1;
	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	int mine = rc ? rank : size, first = mine;
	int mrc = rmoe_allreduce_bounded(w, &mine, &first, 1, MPI_INT, MPI_MIN, comm, what);
	if (mrc)
		return mrc;
	return first == size ? 0 : first_verdict(w, comm, rank, first, rc, what);
}

int rmoe_agree_first_gather(struct rmoe_wait *w, MPI_Comm comm, int rc, const char *what, int64_t value,
                            int64_t *all)
{
	if (rc == RMOE_EPEER)
		return rc;
	int rank = 0, size = 1;
	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &size);
	int64_t mine[2] = {rc ? rank : size, value};
	int64_t *both = malloc(sizeof(int64_t) * 2 * (size_t)size);
	if (!both)
		return rmoe_agree_first(w, comm, rmoe_error(RMOE_ENOMEM, "out of host memory"), what);
	int mrc = rmoe_allgather_bounded(w, mine, both, 2, MPI_INT64_T, comm, what);
	int first = size;
	for (int r = 0; !mrc && r < size; r++) {
		if (both[2 * r] < first)
			first = (int)both[2 * r];
		all[r] = both[2 * r + 1];
	}
	free(both);
	if (mrc)
		return mrc;
	return first == size ? 0 : first_verdict(w, comm, rank, first, rc, what);
}

int rmoe_agree_digest(struct rmoe_wait *w, MPI_Comm comm, uint64_t digest, const char *what)
{
	uint64_t lo = digest, hi = digest;
	int mrc = rmoe_allreduce_bounded(w, &digest, &lo, 1, MPI_UINT64_T, MPI_MIN, comm, what);
	if (!mrc)
		mrc = rmoe_allreduce_bounded(w, &digest, &hi, 1, MPI_UINT64_T, MPI_MAX, comm, what);
	if (mrc)
		return mrc;
	return lo == hi;
}
