/* The runtime's bookkeeping of a pass: the structures StarPU and
 * StarPU-MPI allocate for the graph a pass submits (a handle for every
 * buffer, a task and its dependencies for every operation, a request for
 * every transfer). A pass submits its whole graph at its start, so these
 * live together with the data; the heap figure (heap.c) holds them, the
 * memory model of the data does not. With their counts, taken where every
 * handle, task and request of the library is made (buffers.c, insert.c,
 * transfers.c), and each structure's size in this StarPU, measured once by
 * rmoe_bookkeeping_measure, the layer reports what a pass's graph held
 * (rmoe_layer_stats.runtime_*_bytes): the term that, added to the model,
 * makes it a model of the heap figure too.
 *
 * It is an upper bound of what the peak holds: the structures of tasks
 * that ended before it are already freed. Counts are per process, like
 * the heap figure: two layers' passes running at once would count each
 * other's. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "rmoe_cl_probe.h"

static _Atomic int64_t n_handles, n_tasks, n_task_buffers, n_sends, n_recvs, arg_bytes;

/* Bytes of one structure, 0 until measured (the simulation build never
 * measures: nothing there is allocated for real). */
static struct {
	int64_t handle, task, task_buffer, send, recv;
	int measured;
} unit;

void rmoe_bookkeeping_count_handle(void)
{
	atomic_fetch_add_explicit(&n_handles, 1, memory_order_relaxed);
}

void rmoe_bookkeeping_count_task(int nbuffers, size_t argsize)
{
	atomic_fetch_add_explicit(&n_tasks, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&n_task_buffers, nbuffers, memory_order_relaxed);
	atomic_fetch_add_explicit(&arg_bytes, (int64_t)argsize, memory_order_relaxed);
}

void rmoe_bookkeeping_count_request(int send)
{
	atomic_fetch_add_explicit(send ? &n_sends : &n_recvs, 1, memory_order_relaxed);
}

int64_t rmoe_bookkeeping_bytes(void)
{
	return atomic_load(&n_handles) * unit.handle + atomic_load(&n_tasks) * unit.task +
	       atomic_load(&n_task_buffers) * unit.task_buffer + atomic_load(&n_sends) * unit.send +
	       atomic_load(&n_recvs) * unit.recv + atomic_load(&arg_bytes);
}

void rmoe_bookkeeping_set_requests(int64_t send, int64_t recv)
{
	unit.send = send > 0 ? send : 0;
	unit.recv = recv > 0 ? recv : 0;
}

void rmoe_bookkeeping_units(int64_t *handle, int64_t *task, int64_t *task_buffer, int64_t *send, int64_t *recv)
{
	*handle = unit.handle;
	*task = unit.task;
	*task_buffer = unit.task_buffer;
	*send = unit.send;
	*recv = unit.recv;
}

#ifndef STARPU_SIMGRID
enum { CALIBRATION_COUNT = 64, CALIBRATION_WIDE = 4, CALIBRATION_ARGS = 64 };

static struct starpu_codelet order_only[2] = {
	{.where = STARPU_NOWHERE, .nbuffers = 1, .modes = {STARPU_W}, .name = "bookkeeping"},
	{.where = STARPU_NOWHERE,
	 .nbuffers = CALIBRATION_WIDE,
	 .modes = {STARPU_W, STARPU_W, STARPU_W, STARPU_W},
	 .name = "bookkeeping"},
};

/* The heap's growth per task of nbuf buffers with CALIBRATION_ARGS bytes
 * of arguments, the tasks held back by a gate until measured. */
static int per_task(starpu_data_handle_t *h, int nbuf, int64_t *bytes)
{
	struct starpu_task *gate = starpu_task_create();
	if (!gate)
		return rmoe_error(RMOE_ENOMEM, "out of host memory measuring StarPU's task structures");
	gate->cl = NULL;
	/* A trace reads a task's name when it ends; without one, StarPU 1.3's
	 * FxT records whatever the job's name pointer holds by then. */
	gate->name = "bookkeeping gate";
	gate->detach = 0;
	gate->destroy = 0;
	int64_t before = rmoe_heap_current();
	int rc = 0, submitted = 0;
	for (int i = 0; i < CALIBRATION_COUNT && !rc; i++) {
		struct starpu_data_descr d[CALIBRATION_WIDE];
		for (int b = 0; b < nbuf; b++)
			d[b] = (struct starpu_data_descr){.handle = h[i * CALIBRATION_WIDE + b], .mode = STARPU_W};
		void *args = malloc(CALIBRATION_ARGS);
		struct starpu_task *t = args ? starpu_task_build(&order_only[nbuf > 1], STARPU_DATA_MODE_ARRAY, d, nbuf,
		                                                 STARPU_CL_ARGS, args, (size_t)CALIBRATION_ARGS, 0)
		                             : NULL;
		if (!t) {
			free(args);
			rc = rmoe_error(RMOE_ENOMEM, "out of host memory measuring StarPU's task structures");
			break;
		}
		starpu_task_declare_deps_array(t, 1, &gate);
		if (starpu_task_submit(t)) {
			t->destroy = 0;
			starpu_task_destroy(t);
			rc = rmoe_error(RMOE_ESTARPU, "submitting a task measuring StarPU's task structures failed");
			break;
		}
		submitted++;
	}
	if (submitted)
		*bytes = (rmoe_heap_current() - before) / submitted - CALIBRATION_ARGS;
	/* The gate releases them; nothing of theirs outlives the wait. */
	int ret = starpu_task_submit(gate);
	if (ret == 0)
		ret = starpu_task_wait(gate);
	starpu_task_destroy(gate);
	starpu_task_wait_for_all();
	if (!rc && ret)
		rc = rmoe_error(RMOE_ESTARPU, "the gate of StarPU's task measurement failed (%d)", ret);
	return rc;
}

int rmoe_bookkeeping_measure(void)
{
	if (unit.measured)
		return 0;
	enum { NH = CALIBRATION_COUNT * CALIBRATION_WIDE };
	starpu_data_handle_t *h = calloc(NH, sizeof(*h));
	if (!h)
		return rmoe_error(RMOE_ENOMEM, "out of host memory measuring StarPU's handle structures");
	/* Temporaries as the graph registers them (buffers.c), never allocated
	 * here: their tasks run nowhere. */
	int64_t before = rmoe_heap_current();
	for (int i = 0; i < NH; i++)
		starpu_vector_data_register(&h[i], -1, 0, 1, sizeof(float));
	int64_t handle = (rmoe_heap_current() - before) / NH;
	int64_t one = 0, wide = 0;
	int rc = per_task(h, 1, &one);
	if (!rc)
		rc = per_task(h, CALIBRATION_WIDE, &wide);
	for (int i = 0; i < NH; i++)
		starpu_data_unregister_submit(h[i]);
	starpu_task_wait_for_all();
	free(h);
	if (rc)
		return rc;
	unit.handle = handle > 0 ? handle : 0;
	unit.task_buffer = wide > one ? (wide - one) / (CALIBRATION_WIDE - 1) : 0;
	unit.task = one - unit.task_buffer > 0 ? one - unit.task_buffer : 0;
	unit.measured = 1;
	return 0;
}
#else
int rmoe_bookkeeping_measure(void)
{
	return 0;
}
#endif
