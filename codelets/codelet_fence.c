/* The ordering task: no kernel, no data movement, only the dependencies of
 * its accesses. The graphs use it to say when a buffer may come to exist
 * (its first access) or stop existing (its last), where no computation
 * states it. */
#include "codelet.h"

/* STARPU_NOWHERE: StarPU neither schedules the task nor fetches (nor
 * allocates) its buffers; once its dependencies are met it ends at once,
 * releasing its accesses in order. It is also why there is no perfmodel, no
 * function and no prologue (nothing runs to sample the memory probe). */
static struct starpu_codelet rmoe_cl_fence = {
	.name = "fence",
	.where = STARPU_NOWHERE,
	.nbuffers = STARPU_VARIABLE_NBUFFERS,
};

int rmoe_insert_fence(const struct rmoe_task_opts *o, const starpu_data_handle_t *ready, int nready,
                      const starpu_data_handle_t *next, int nnext)
{
	struct starpu_data_descr *d = calloc((size_t)(nready + nnext > 0 ? nready + nnext : 1), sizeof(*d));
	if (!d)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int nb = 0;
	/* Read: wait for the writers. Write: wait for every earlier access and
	 * make every later one wait; the contents are never touched. */
	for (int i = 0; i < nready; i++)
		if (ready[i])
			d[nb++] = (struct starpu_data_descr){ready[i], STARPU_R};
	for (int i = 0; i < nnext; i++)
		if (next[i])
			d[nb++] = (struct starpu_data_descr){next[i], STARPU_W};
	int rc = rmoe_cl_insert(o, &rmoe_cl_fence, d, nb, NULL, 0, 0);
	free(d);
	return rc;
}
