/* A platform probe for StarPU-SimGrid over SMPI (scripts/sim/probe/check.sh).
 *
 *   ring BYTES HOPS [TASK_US]
 *
 * 1. StarPU-MPI ping-pong of BYTES in host memory between rank 0 and every
 *    other rank, one pair at a time: the one-way time ("pingpong").
 * 2. A StarPU-MPI ring: each rank owns a buffer of BYTES, and HOPS times
 *    every rank runs a task of TASK_US simulated microseconds on it (on the
 *    GPU when the description has one, else a CPU), then sends it to
 *    rank + 1 and receives its predecessor's ("ring"). With a GPU the buffer
 *    travels device -> host (PCIe of the description) -> network, so a hop
 *    costs task + device-to-host + link + host-to-device when the next task
 *    reads it.
 *
 * Times are StarPU's clock: simulated seconds under SimGrid. */
#include <starpu.h>
#include <starpu_mpi.h>
#include <stdio.h>
#include <stdlib.h>

static double task_us = 1000.0;

static void work(void *buffers[], void *arg)
{
	(void)buffers;
	(void)arg;
}

static double cost(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)task;
	(void)arch;
	(void)nimpl;
	return task_us;   /* microseconds */
}

static struct starpu_perfmodel model = {
	.type = STARPU_PER_ARCH,
	.symbol = "rmoe_probe_work",
	.arch_cost_function = cost,
};

static struct starpu_codelet cl = {
	.cpu_funcs = {work},
#ifdef STARPU_SIMGRID
	.cuda_funcs = {(starpu_cuda_func_t)1},
#endif
	.nbuffers = 1,
	.modes = {STARPU_RW},
	.model = &model,
	.name = "probe_work",
};

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: ring BYTES HOPS [TASK_US]\n");
		return 2;
	}
	size_t bytes = (size_t)strtoull(argv[1], NULL, 10);
	int hops = atoi(argv[2]);
	if (argc > 3)
		task_us = atof(argv[3]);
	if (bytes < 8 || hops < 1) {
		fprintf(stderr, "ring: BYTES >= 8 and HOPS >= 1\n");
		return 2;
	}
	/* Under SimGrid, StarPU-MPI initialises SMPI before main runs (main is
	 * an actor of its own): the program must not call MPI_Init itself. */
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	if (starpu_mpi_init_conf(&argc, &argv, 1, MPI_COMM_WORLD, &conf) != 0) {
		fprintf(stderr, "ring: starpu_mpi_init_conf failed\n");
		return 1;
	}
	int rank, size;
	starpu_mpi_comm_rank(MPI_COMM_WORLD, &rank);
	starpu_mpi_comm_size(MPI_COMM_WORLD, &size);

	size_t n = bytes / sizeof(float);
	float *a = NULL, *b = NULL;
	starpu_malloc_flags((void **)&a, n * sizeof(float), STARPU_MALLOC_PINNED | STARPU_MALLOC_SIMULATION_FOLDED);
	starpu_malloc_flags((void **)&b, n * sizeof(float), STARPU_MALLOC_PINNED | STARPU_MALLOC_SIMULATION_FOLDED);
	starpu_data_handle_t cur, next;
	starpu_vector_data_register(&cur, STARPU_MAIN_RAM, (uintptr_t)a, n, sizeof(float));
	starpu_vector_data_register(&next, STARPU_MAIN_RAM, (uintptr_t)b, n, sizeof(float));

	/* 1. ping-pong from rank 0, host memory to host memory */
	const int reps = 4;
	for (int peer = 1; peer < size; peer++) {
		starpu_mpi_barrier(MPI_COMM_WORLD);
		double t0 = starpu_timing_now();
		for (int i = 0; i < reps; i++) {
			if (rank == 0) {
				starpu_mpi_send(cur, peer, 2 * i, MPI_COMM_WORLD);
				starpu_mpi_recv(cur, peer, 2 * i + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else if (rank == peer) {
				starpu_mpi_recv(cur, 0, 2 * i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				starpu_mpi_send(cur, 0, 2 * i + 1, MPI_COMM_WORLD);
			}
		}
		double t = starpu_timing_now() - t0;
		if (rank == 0)
			printf("pingpong src=0 dst=%d bytes=%zu oneway_s=%.9f\n", peer, bytes, t * 1e-6 / (2.0 * reps));
	}

	/* 2. StarPU-MPI ring */
	int to = (rank + 1) % size, from = (rank + size - 1) % size;
	starpu_mpi_barrier(MPI_COMM_WORLD);
	double t0 = starpu_timing_now();
	double compute = 0, comm = 0;
	for (int h = 0; h < hops; h++) {
		double c0 = starpu_timing_now();
		struct starpu_task *task = starpu_task_create();
		task->cl = &cl;
		task->handles[0] = cur;
		task->synchronous = 1;
		if (starpu_task_submit(task) != 0) {
			fprintf(stderr, "ring: no worker can run the probe task\n");
			return 1;
		}
		double c1 = starpu_timing_now();
		starpu_mpi_req sreq, rreq;
		starpu_mpi_isend(cur, &sreq, to, h, MPI_COMM_WORLD);
		starpu_mpi_irecv(next, &rreq, from, h, MPI_COMM_WORLD);
		starpu_mpi_wait(&sreq, MPI_STATUS_IGNORE);
		starpu_mpi_wait(&rreq, MPI_STATUS_IGNORE);
		double c2 = starpu_timing_now();
		compute += c1 - c0;
		comm += c2 - c1;
		starpu_data_handle_t t = cur;
		cur = next;
		next = t;
	}
	double t = starpu_timing_now() - t0;
	printf("ring rank=%d to=%d bytes=%zu hops=%d total_s=%.9f hop_s=%.9f task_s=%.9f comm_s=%.9f ncuda=%u ncpu=%u gpu_mem=%lld\n",
	       rank, to, bytes, hops, t * 1e-6, t * 1e-6 / hops, compute * 1e-6 / hops, comm * 1e-6 / hops,
	       starpu_cuda_worker_get_count(), starpu_cpu_worker_get_count(),
	       (long long)(starpu_memory_nodes_get_count() > 1 ? starpu_memory_get_total(1) : 0));
	starpu_data_unregister(cur);
	starpu_data_unregister(next);
	starpu_free_flags(a, n * sizeof(float), STARPU_MALLOC_PINNED | STARPU_MALLOC_SIMULATION_FOLDED);
	starpu_free_flags(b, n * sizeof(float), STARPU_MALLOC_PINNED | STARPU_MALLOC_SIMULATION_FOLDED);
	starpu_mpi_shutdown();
	return 0;
}
