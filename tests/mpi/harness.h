/* What the multi-rank tests share: their start (MPI and a context) and
 * end (the verdict over every rank), the skip code CTest knows, and the
 * uneven routing several of them run. */
#ifndef RMOE_TEST_HARNESS_H
#define RMOE_TEST_HARNESS_H

#include <stdint.h>

#include "problem.h"
#include "relaymoe/relaymoe.h"

/* The exit code of a test that cannot run here, the machine lacking what
 * it needs (no CUDA worker, too few ranks): CTest reports it skipped
 * (SKIP_RETURN_CODE in tests/CMakeLists.txt), as StarPU's tests do with
 * STARPU_TEST_SKIPPED. An error of the library is never a skip. */
#define RMOE_TEST_SKIPPED 77

/* The start of a multi-rank test: MPI (MPI_THREAD_MULTIPLE) and a context
 * over MPI_COMM_WORLD, *nranks its size. When a rank cannot create the
 * context the test fails (exit 1, after MPI_Finalize), saying why on every
 * rank: a library error is never a skip. The one exception is what the
 * machine lacks: StarPU finding no worker of the kinds the test's
 * environment asks for (RMOE_ENOTSUP, e.g. STARPU_NCPU=0 without a GPU)
 * skips it (RMOE_TEST_SKIPPED), saying so. */
rmoe_ctx *rmoe_test_start(int *argc, char ***argv, int *nranks);

/* The same with the context's ranks grouped into nodes of ranks_per_node
 * consecutive ranks (rmoe_ctx_config.ranks_per_node; 0: by host). */
rmoe_ctx *rmoe_test_start_nodes(int *argc, char ***argv, int *nranks, int ranks_per_node);

/* The end of a multi-rank test: destroys ctx, prints "NAME: passed" or
 * "NAME: FAILED (N failure(s))" from the most failures of any rank, ends
 * MPI; the exit status (0 or 1). */
int rmoe_test_end(rmoe_ctx *ctx, const char *name, int failures);

/* A test that has nothing to show on this many ranks: destroys ctx, says
 * why (NAME: skipped: WHY) on rank 0, ends MPI; RMOE_TEST_SKIPPED. */
int rmoe_test_skip(rmoe_ctx *ctx, const char *name, const char *why);

/* Skews the router so that experts [0, hot) take nearly every token: most
 * partitions then receive no pair, and ranks whose experts are cold compute
 * no rows (the tests' uneven routing). */
void rmoe_test_skew_router(struct rmoe_problem *p, int64_t hot);

#endif
