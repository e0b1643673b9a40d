/* The one part of the relaymoe API that takes an MPI type. */
#ifndef RELAYMOE_MPI_H
#define RELAYMOE_MPI_H

#include <mpi.h>

#include "relaymoe/relaymoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* As rmoe_ctx_create, over comm (the expert-parallel group). MPI must be
 * initialised, with MPI_THREAD_MULTIPLE. If the application already runs
 * StarPU-MPI, comm must be the communicator StarPU-MPI was started with. */
RMOE_API int rmoe_ctx_create_comm(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg, MPI_Comm comm);

#ifdef __cplusplus
}
#endif

#endif
