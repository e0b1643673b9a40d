/* StarPU started with the codelets registered, for a CMocka group of
 * codelet tests: one CPU worker, or one CUDA worker (the gpu label). */
#ifndef RMOE_TEST_CODELETS_FIXTURE_H
#define RMOE_TEST_CODELETS_FIXTURE_H

#include <starpu.h>

#include "rmoe_codelets.h"

/* 0, or StarPU's error (-ENODEV where no worker of the kind exists). */
static inline int codelets_fixture_start(int cuda)
{
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.ncpus = cuda ? 0 : 1;
	conf.ncuda = cuda ? 1 : 0;
	conf.nopencl = 0;
	int ret = starpu_init(&conf);
	if (ret != 0)
		return ret;
	rmoe_codelets_init();
	rmoe_codelets_init(); /* idempotent */
	rmoe_codelets_start();
	return 0;
}

static inline int codelets_fixture_stop(void **state)
{
	(void)state;
	rmoe_codelets_stop();
	starpu_shutdown();
	return 0;
}

#endif
