/* The one-time set-up of the kernels' environment: BLAS threads, and in the
 * simulation build its cost models. */
#include <stdatomic.h>

#include "codelet.h"

static atomic_flag rmoe_codelets_initialised = ATOMIC_FLAG_INIT;
static int rmoe_codelets_init_rc;

int rmoe_codelets_init(void)
{
	if (atomic_flag_test_and_set(&rmoe_codelets_initialised))
		return rmoe_codelets_init_rc;
	/* StarPU runs one worker per core: a BLAS call inside a task must not
	 * start threads of its own on the cores of the other workers. */
	rmoe_codelets_blas_threads(1);
#ifdef STARPU_SIMGRID
	/* The simulation's cost models read their rates, or a recording
	 * (sim_cost.c, only in that build). */
	rmoe_codelets_init_rc = rmoe_sim_cost_init();
#endif
	return rmoe_codelets_init_rc;
}
