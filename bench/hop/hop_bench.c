/* What one ring hop's transfer costs: StarPU-MPI against plain MPI, side by
 * side in one run, message sizes 4 KB to 256 MB.
 *
 * Every rank sends to its right neighbour and receives from its left, as the
 * ring of graph/dispatch/ring_expert.c does (paper §3.1):
 *   mpi      MPI_Isend of buffer h%2, MPI_Irecv into buffer (h+1)%2, MPI_Waitall;
 *            StarPU paused, so its threads take no CPU.
 *   awake    the same while StarPU runs idle: what its spinning worker
 *            costs plain MPI, measured directly.
 *   starpu   the layer's pattern: starpu_mpi_isend_detached of handle h%2,
 *            starpu_mpi_irecv_detached into handle (h+1)%2 (StarPU orders it
 *            after hop h-1's readers: the double buffering), a task reading
 *            the held handle; --split S sends each buffer as handles of at
 *            most S bytes.
 * Per size and mode: the median over --reps repetitions of (time of H hops)
 * / H, the slowest rank's. Rank 0 prints a table and appends to --csv.
 *
 *   mpirun -np 2 hop_bench [--sizes 4K,64K,1M,...] [--reps 3] [--split BYTES]
 *                          [--csv FILE] [--label TEXT]
 */
#include <mpi.h>
#include <starpu.h>
#include <starpu_mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 32

static int rank, nranks, left, right;
static MPI_Comm plain_comm, starpu_comm;
static int64_t next_tag = 1;

static int64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	switch (*end) {
	case 'K': case 'k': v *= 1024; break;
	case 'M': case 'm': v *= 1024 * 1024; break;
	case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
	default: break;
	}
	return (int64_t)v;
}

/* Hops per measurement: enough to amortise the start, few at 256 MB. */
static int hops_for(int64_t bytes)
{
	int64_t h = ((int64_t)256 << 20) / bytes;
	return (int)(h < 6 ? 6 : h > 200 ? 200 : h);
}

static double slowest(double t)
{
	double m;
	MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return m;
}

static double ring_mpi(char *buf[2], int64_t bytes, int hops)
{
	MPI_Barrier(plain_comm);
	double t0 = MPI_Wtime();
	for (int h = 0; h < hops; h++) {
		MPI_Request rq[2];
		MPI_Irecv(buf[(h + 1) % 2], (int)bytes, MPI_BYTE, left, h, plain_comm, &rq[0]);
		MPI_Isend(buf[h % 2], (int)bytes, MPI_BYTE, right, h, plain_comm, &rq[1]);
		MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
	}
	return slowest(MPI_Wtime() - t0) / hops;
}

/* A hop's compute stand-in: reads the partition it holds. */
static void touch(void *descr[], void *arg)
{
	(void)arg;
	volatile char *p = (volatile char *)STARPU_VECTOR_GET_PTR(descr[0]);
	(void)p[0];
}
static struct starpu_codelet touch_cl = {
	.cpu_funcs = {touch}, .nbuffers = 1, .modes = {STARPU_R}, .name = "hop-task"};

static double ring_starpu(starpu_data_handle_t *hb[2], int pieces, int hops)
{
	/* Same-size tags on both sides: every rank runs the same sequence. */
	int64_t tag0 = next_tag;
	next_tag += (int64_t)hops * pieces;
	MPI_Barrier(plain_comm);
	double t0 = MPI_Wtime();
	for (int h = 0; h < hops; h++) {
		starpu_data_handle_t *hold = hb[h % 2], *next = hb[(h + 1) % 2];
		for (int k = 0; k < pieces; k++) {
			int64_t tag = tag0 + (int64_t)h * pieces + k;
			STARPU_CHECK_RETURN_VALUE(starpu_mpi_isend_detached_prio(hold[k], right, tag, 1, starpu_comm,
			                                                         NULL, NULL),
			                          "isend");
			STARPU_CHECK_RETURN_VALUE(starpu_mpi_irecv_detached(next[k], left, tag, starpu_comm, NULL, NULL),
			                          "irecv");
		}
		for (int k = 0; k < pieces; k++)
			STARPU_CHECK_RETURN_VALUE(starpu_task_insert(&touch_cl, STARPU_R, hold[k], 0), "task");
	}
	/* Wait for the data, not with a barrier (starpu.md: a barrier inside
	 * the progress thread can deadlock with receives still pending). */
	starpu_task_wait_for_all();
	for (int b = 0; b < 2; b++)
		for (int k = 0; k < pieces; k++) {
			starpu_data_acquire(hb[b][k], STARPU_R);
			starpu_data_release(hb[b][k]);
		}
	return slowest(MPI_Wtime() - t0) / hops;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	const char *sizes_arg = "4K,16K,64K,256K,1M,4M,16M,64M,256M", *csv = NULL, *label = "default";
	int reps = 3;
	int64_t split = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
			sizes_arg = argv[++i];
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--split") && i + 1 < argc)
			split = parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
			csv = argv[++i];
		else if (!strcmp(argv[i], "--label") && i + 1 < argc)
			label = argv[++i];
		else {
			fprintf(stderr, "hop_bench: unknown or incomplete option '%s'\n", argv[i]);
			return 2;
		}
	}
	if (reps < 1 || reps > 99)
		reps = 3;
	int64_t sizes[MAX_SIZES];
	int nsizes = 0;
	char *list = strdup(sizes_arg);
	for (char *tok = strtok(list, ","); tok && nsizes < MAX_SIZES; tok = strtok(NULL, ","))
		sizes[nsizes++] = parse_size(tok);
	free(list);

	int provided;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (nranks < 2 || provided < MPI_THREAD_MULTIPLE) {
		if (rank == 0)
			fprintf(stderr, "hop_bench: needs at least 2 ranks and MPI_THREAD_MULTIPLE\n");
		MPI_Finalize();
		return 77;
	}
	left = (rank + nranks - 1) % nranks;
	right = (rank + 1) % nranks;
	MPI_Comm_dup(MPI_COMM_WORLD, &plain_comm);
	MPI_Comm_dup(MPI_COMM_WORLD, &starpu_comm);
	/* As rmoe_ctx_create does with several ranks on a node: StarPU would
	 * otherwise bind every rank's worker to core 0. */
	setenv("STARPU_WORKERS_NOBIND", "1", 0);
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	if (!getenv("STARPU_NCPU"))
		conf.ncpus = 1;
	STARPU_CHECK_RETURN_VALUE(starpu_mpi_init_conf(NULL, NULL, 0, starpu_comm, &conf), "starpu_mpi_init_conf");

	FILE *out = NULL;
	if (rank == 0 && csv) {
		out = fopen(csv, "a");
		if (out && ftell(out) == 0)
			fprintf(out, "label,ranks,split_bytes,bytes,hops,mpi_ms,awake_ms,starpu_ms,starpu_over_mpi,"
			             "mpi_gbs,starpu_gbs\n");
	}
	if (rank == 0)
		printf("%-10s %5s %10s %10s %10s %8s %9s %9s\n", "bytes", "hops", "mpi ms", "awake ms",
		       "starpu ms", "ratio", "mpi GB/s", "spu GB/s");
	for (int s = 0; s < nsizes; s++) {
		int64_t bytes = sizes[s];
		int hops = hops_for(bytes);
		int64_t piece = split > 0 && split < bytes ? split : bytes;
		int pieces = (int)((bytes + piece - 1) / piece);
		char *buf[2];
		starpu_data_handle_t *hb[2];
		for (int b = 0; b < 2; b++) {
			buf[b] = malloc((size_t)bytes);
			memset(buf[b], rank + b, (size_t)bytes); /* first touch outside the timing */
			hb[b] = malloc(sizeof(starpu_data_handle_t) * (size_t)pieces);
			for (int k = 0; k < pieces; k++) {
				int64_t off = (int64_t)k * piece, n = bytes - off < piece ? bytes - off : piece;
				starpu_vector_data_register(&hb[b][k], STARPU_MAIN_RAM, (uintptr_t)(buf[b] + off),
				                            (uint32_t)n, 1);
			}
		}
		double t_mpi[100], t_awake[100], t_spu[100];
		/* One of each before timing: connections, registration caches. */
		starpu_pause();
		ring_mpi(buf, bytes, 2);
		starpu_resume();
		ring_starpu(hb, pieces, 2);
		for (int r = 0; r < reps; r++) {
			starpu_pause();
			t_mpi[r] = ring_mpi(buf, bytes, hops);
			starpu_resume();
			t_awake[r] = ring_mpi(buf, bytes, hops);
			t_spu[r] = ring_starpu(hb, pieces, hops);
		}
		qsort(t_mpi, (size_t)reps, sizeof(double), cmp);
		qsort(t_awake, (size_t)reps, sizeof(double), cmp);
		qsort(t_spu, (size_t)reps, sizeof(double), cmp);
		double m = t_mpi[reps / 2] * 1e3, a = t_awake[reps / 2] * 1e3, p = t_spu[reps / 2] * 1e3;
		if (rank == 0) {
			printf("%-10lld %5d %10.3f %10.3f %10.3f %8.2f %9.2f %9.2f\n", (long long)bytes, hops, m, a, p,
			       p / m, bytes / m / 1e6, bytes / p / 1e6);
			fflush(stdout);
			if (out)
				fprintf(out, "%s,%d,%lld,%lld,%d,%.4f,%.4f,%.4f,%.3f,%.3f,%.3f\n", label, nranks,
				        (long long)(split > 0 ? split : 0), (long long)bytes, hops, m, a, p, p / m,
				        bytes / m / 1e6, bytes / p / 1e6);
		}
		for (int b = 0; b < 2; b++) {
			for (int k = 0; k < pieces; k++)
				starpu_data_unregister(hb[b][k]);
			free(hb[b]);
			free(buf[b]);
		}
	}
	if (out)
		fclose(out);
	starpu_mpi_shutdown();
	MPI_Comm_free(&plain_comm);
	MPI_Comm_free(&starpu_comm);
	MPI_Finalize();
	return 0;
}
