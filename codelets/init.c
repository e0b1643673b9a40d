/* The one-time set-up of the kernels' environment. */
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
	rmoe_codelets_init_rc = rmoe_sim_cost_init();
	return rmoe_codelets_init_rc;
}
