/* Multi-rank: the bounded collectives of graph/context/collective.c. With a timeout
 * they are point-to-point exchanges, and must give what the MPI collectives
 * give (a floating-point sum the same bits on every rank, in rank order);
 * one that gives up must name exactly the ranks whose contribution it
 * lacks, and the exchange must stay usable by a rank that comes late.
 * Run under mpiexec -n N, N >= 2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "harness.h"
#include "rmoe_collective.h"

enum { COUNT = 37 };

static int rank, size, failures;

static void expect(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "rank %d: FAIL %s\n", rank, what);
		failures++;
	}
}

/* Rank r's seeded contribution, known to every rank. */
static void contribution(int r, double *d, int64_t *i)
{
	unsigned short seed[3] = {0x5eed, (unsigned short)r, 0x1234};
	for (int k = 0; k < COUNT; k++) {
		d[k] = erand48(seed) * 2 - 1;
		i[k] = (int64_t)(erand48(seed) * 1e12) - (int64_t)5e11;
	}
}

static void check_values(double timeout)
{
	double d[COUNT], sum[COUNT], ref[COUNT], all[COUNT * 64];
	int64_t i[COUNT], lo[COUNT], iref[COUNT];
	char label[96];
	struct rmoe_wait w = rmoe_wait_make(timeout);
	/* Reference: the sum in rank order, (((c0 + c1) + c2) ...) from the
	 * last rank down as MPI_Reduce_local builds it; the minimum. */
	for (int r = size - 1; r >= 0; r--) {
		double cd[COUNT];
		int64_t ci[COUNT];
		contribution(r, cd, ci);
		for (int k = 0; k < COUNT; k++) {
			ref[k] = r == size - 1 ? cd[k] : cd[k] + ref[k];
			iref[k] = r == size - 1 || ci[k] < iref[k] ? ci[k] : iref[k];
		}
	}
	contribution(rank, d, i);
	snprintf(label, sizeof(label), "allreduce (timeout %g s)", timeout);
	expect(rmoe_allreduce_bounded(&w, d, sum, COUNT, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, "a test sum") == 0, label);
	expect(rmoe_allreduce_bounded(&w, i, lo, COUNT, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD, "a test min") == 0, label);
	for (int k = 0; k < COUNT; k++) {
		expect(lo[k] == iref[k], "allreduce MPI_MIN: the smallest contribution");
		/* MPI_Allreduce's order is its own: only the exchange is bitwise. */
		if (timeout > 0)
			expect(memcmp(&sum[k], &ref[k], sizeof(double)) == 0, "allreduce MPI_SUM: rank-order bits");
		else
			expect(fabs(sum[k] - ref[k]) <= 1e-12 * size, "allreduce MPI_SUM: the sum");
	}
	/* The same bits on every rank: rank 0's sum sent to all. */
	double first[COUNT];
	memcpy(first, sum, sizeof(first));
	expect(rmoe_bcast_bounded(&w, first, COUNT, MPI_DOUBLE, 0, MPI_COMM_WORLD, "a test bcast") == 0, "bcast");
	expect(memcmp(first, sum, sizeof(first)) == 0, "allreduce: the same bits on every rank");
	/* A root that is not rank 0 sends its own contribution. */
	double from_last[COUNT];
	memcpy(from_last, d, sizeof(d));
	expect(rmoe_bcast_bounded(&w, from_last, COUNT, MPI_DOUBLE, size - 1, MPI_COMM_WORLD, "a test bcast") == 0,
	       "bcast from the last rank");
	double cd[COUNT];
	int64_t ci[COUNT];
	contribution(size - 1, cd, ci);
	expect(memcmp(from_last, cd, sizeof(cd)) == 0, "bcast: the root's contribution");
	if (size <= 64) {
		expect(rmoe_allgather_bounded(&w, d, all, COUNT, MPI_DOUBLE, MPI_COMM_WORLD, "a test allgather") == 0,
		       "allgather");
		for (int r = 0; r < size; r++) {
			contribution(r, cd, ci);
			expect(memcmp(all + r * COUNT, cd, sizeof(cd)) == 0, "allgather: rank r's contribution at r");
		}
	}
	/* Each call counted in its own wait state, and only there. */
	expect(w.count == (size <= 64 ? 5 : 4), "every collective counts one wait in the state it was given");
}

/* The last rank comes late to a vote: the others give up after the timeout
 * and name it, and only it; then it votes, and the exchange the others
 * abandoned takes its contribution (no message of it is left unmatched). */
static void check_missing(void)
{
	int late = size - 1, mine = rank + 1, low = 0, got[RMOE_WAIT_MISSING_MAX];
	MPI_Comm comm;
	MPI_Comm_dup(MPI_COMM_WORLD, &comm);
	struct rmoe_wait w = rmoe_wait_make(0.5);
	if (rank != late) {
		int rc = rmoe_allreduce_bounded(&w, &mine, &low, 1, MPI_INT, MPI_MIN, comm, "a test vote");
		expect(rc == RMOE_EPEER, "a vote without the last rank gives up with RMOE_EPEER");
		expect(strstr(rmoe_strerror(rc), "no answer from rank(s) ") != NULL, "its message names ranks");
		int m = rmoe_wait_missing(&w, got, RMOE_WAIT_MISSING_MAX);
		expect(m == 1 && got[0] == late, "it names the late rank, and only it");
		/* Another call's state knows nothing of that timeout (the wait
		 * state is the call's, not the thread's). */
		struct rmoe_wait other = rmoe_wait_make(0);
		expect(rmoe_wait_missing(&other, got, RMOE_WAIT_MISSING_MAX) == -1 && other.count == 0 &&
		               other.timeout == 0,
		       "a fresh wait state holds no other call's timeout, count or missing ranks");
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == late) {
		w = rmoe_wait_make(5);
		expect(rmoe_allreduce_bounded(&w, &mine, &low, 1, MPI_INT, MPI_MIN, comm, "a test vote") == 0 && low == 1,
		       "the late rank's vote: every other rank's contribution came");
	}
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Comm_free(&comm);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size < 2) {
		if (rank == 0)
			fprintf(stderr, "test_collective: needs 2 or more ranks\n");
		MPI_Finalize();
		return RMOE_TEST_SKIPPED;
	}
	check_values(0);
	check_values(5);
	check_missing();
	int total = 0;
	MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("test_collective: %d rank(s), %d failure(s)\n", size, total);
	MPI_Finalize();
	return total ? 1 : 0;
}
