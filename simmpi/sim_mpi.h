/* The simulation build's MPI (force-included by CMake with RMOE_SIMGRID=ON,
 * never otherwise).
 *
 * Under StarPU-SimGrid over SMPI the MPI rank is StarPU-MPI's progress
 * thread: StarPU initialises SMPI there before the application's main runs
 * in a thread of its own, and SMPI refuses MPI calls from any other thread
 * ("MPI_Init was not called"). The few MPI calls of relaymoe's host code
 * (rank and size, the collective checks and agreements, the programs' max
 * over ranks) therefore go through StarPU-MPI instead: sim_mpi.c implements
 * them over starpu_mpi_send/recv to and from rank 0, in the simulated
 * network. The graph's transfers are StarPU-MPI's already. Sub-communicators
 * (the node split) are single-rank: a simulated rank knows no node-mates. */
#ifndef RMOE_SIM_MPI_H
#define RMOE_SIM_MPI_H

#include <mpi.h>

int rmoe_sim_MPI_Init_thread(int *argc, char ***argv, int required, int *provided);
int rmoe_sim_MPI_Initialized(int *flag);
int rmoe_sim_MPI_Query_thread(int *provided);
int rmoe_sim_MPI_Finalize(void);
double rmoe_sim_MPI_Wtime(void);
int rmoe_sim_MPI_Get_processor_name(char *name, int *len);
int rmoe_sim_MPI_Comm_rank(MPI_Comm comm, int *rank);
int rmoe_sim_MPI_Comm_size(MPI_Comm comm, int *size);
int rmoe_sim_MPI_Comm_dup(MPI_Comm comm, MPI_Comm *out);
int rmoe_sim_MPI_Comm_free(MPI_Comm *comm);
int rmoe_sim_MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm *out);
int rmoe_sim_MPI_Barrier(MPI_Comm comm);
int rmoe_sim_MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm);
int rmoe_sim_MPI_Allreduce(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);
int rmoe_sim_MPI_Reduce(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, int root,
                        MPI_Comm comm);
int rmoe_sim_MPI_Allgather(const void *in, int scount, MPI_Datatype stype, void *out, int rcount,
                           MPI_Datatype rtype, MPI_Comm comm);
int rmoe_sim_MPI_Gather(const void *in, int scount, MPI_Datatype stype, void *out, int rcount,
                        MPI_Datatype rtype, int root, MPI_Comm comm);
int rmoe_sim_MPI_Iallreduce(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                            MPI_Request *req);
int rmoe_sim_MPI_Ibcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request *req);
int rmoe_sim_MPI_Iallgather(const void *in, int scount, MPI_Datatype stype, void *out, int rcount,
                            MPI_Datatype rtype, MPI_Comm comm, MPI_Request *req);
int rmoe_sim_MPI_Test(MPI_Request *req, int *flag, MPI_Status *status);
int rmoe_sim_MPI_Wait(MPI_Request *req, MPI_Status *status);

#define MPI_Init_thread rmoe_sim_MPI_Init_thread
#define MPI_Initialized rmoe_sim_MPI_Initialized
#define MPI_Query_thread rmoe_sim_MPI_Query_thread
#define MPI_Finalize rmoe_sim_MPI_Finalize
#define MPI_Wtime rmoe_sim_MPI_Wtime
#define MPI_Get_processor_name rmoe_sim_MPI_Get_processor_name
#define MPI_Comm_rank rmoe_sim_MPI_Comm_rank
#define MPI_Comm_size rmoe_sim_MPI_Comm_size
#define MPI_Comm_dup rmoe_sim_MPI_Comm_dup
#define MPI_Comm_free rmoe_sim_MPI_Comm_free
#define MPI_Comm_split_type rmoe_sim_MPI_Comm_split_type
#define MPI_Barrier rmoe_sim_MPI_Barrier
#define MPI_Bcast rmoe_sim_MPI_Bcast
#define MPI_Allreduce rmoe_sim_MPI_Allreduce
#define MPI_Reduce rmoe_sim_MPI_Reduce
#define MPI_Allgather rmoe_sim_MPI_Allgather
#define MPI_Gather rmoe_sim_MPI_Gather
#define MPI_Iallreduce rmoe_sim_MPI_Iallreduce
#define MPI_Ibcast rmoe_sim_MPI_Ibcast
#define MPI_Iallgather rmoe_sim_MPI_Iallgather
#define MPI_Test rmoe_sim_MPI_Test
#define MPI_Wait rmoe_sim_MPI_Wait

#endif /* RMOE_SIM_MPI_H */
