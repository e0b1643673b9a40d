/* The MPI of the simulation build's host code, over StarPU-MPI (see
 * sim_mpi.h for why). Collectives gather to rank 0 and scatter back with
 * blocking StarPU-MPI transfers of small host buffers, so they take
 * simulated network time as real ones would. Built only with RMOE_SIMGRID. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>
#include <starpu_mpi.h>

#include "sim_mpi.h"

/* A single-rank communicator (the node split), told apart by address. */
static int sim_self_comm;
#define SIM_SELF ((MPI_Comm)(void *)&sim_self_comm)

/* Tags of the collectives: below the context's window (the upper half of
 * StarPU-MPI's 64-bit tags, tags.c); one per call, in call order, which is
 * the same on every rank. */
#define SIM_TAG_BASE ((int64_t)1 << 40)
static int64_t sim_seq;

static int world_rank(void)
{
	return starpu_mpi_world_rank();
}

static int comm_size(MPI_Comm comm)
{
	return comm == SIM_SELF ? 1 : starpu_mpi_world_size();
}

/* 0 for a datatype the simulated collectives do not know (MPI_ERR_TYPE). */
static size_t type_size(MPI_Datatype t)
{
	if (t == MPI_INT || t == MPI_INT32_T || t == MPI_FLOAT || t == MPI_UINT32_T)
		return 4;
	if (t == MPI_INT64_T || t == MPI_UINT64_T || t == MPI_DOUBLE || t == MPI_LONG_LONG || t == MPI_LONG)
		return 8;
	if (t == MPI_BYTE || t == MPI_CHAR || t == MPI_SIGNED_CHAR || t == MPI_UNSIGNED_CHAR)
		return 1;
	return 0;
}

/* Blocking transfer of a host buffer with StarPU-MPI; an MPI error code. */
static int xfer(void *buf, size_t bytes, int peer, int64_t tag, int send)
{
	if (bytes == 0)
		return MPI_SUCCESS;
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)buf, (uint32_t)bytes, 1);
	int ret = send ? starpu_mpi_send(h, peer, tag, MPI_COMM_WORLD)
	               : starpu_mpi_recv(h, peer, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	starpu_data_unregister(h);
	return ret ? MPI_ERR_OTHER : MPI_SUCCESS;
}

/* Every rank's bytes of in, in rank order, into all (n * bytes) on every
 * rank: the one primitive of the collectives. Before StarPU runs (a check
 * of the context's set-up) there is no transport: each rank sees its own. */
static int allgather_bytes(const void *in, size_t bytes, void *all, MPI_Comm comm)
{
	const int n = comm_size(comm), me = comm == SIM_SELF ? 0 : world_rank();
	int64_t tag = SIM_TAG_BASE + sim_seq++;
	int rc = MPI_SUCCESS;
	memmove((char *)all + (size_t)me * bytes, in, bytes);
	if (n == 1 || !starpu_is_initialized())
		return rc;
	if (me == 0) {
		for (int q = 1; q < n && rc == MPI_SUCCESS; q++)
			rc = xfer((char *)all + (size_t)q * bytes, bytes, q, tag, 0);
		for (int q = 1; q < n && rc == MPI_SUCCESS; q++)
			rc = xfer(all, (size_t)n * bytes, q, tag, 1);
	} else {
		rc = xfer((char *)all + (size_t)me * bytes, bytes, 0, tag, 1);
		if (rc == MPI_SUCCESS)
			rc = xfer(all, (size_t)n * bytes, 0, tag, 0);
	}
	return rc;
}

#define REDUCE_AS(T)                                                                      \
	do {                                                                              \
		T *o = out;                                                               \
		const T *a = all;                                                         \
		for (int i = 0; i < count; i++) {                                         \
			T v = a[i];                                                       \
			for (int q = 1; q < n; q++) {                                     \
				T w = a[(size_t)q * (size_t)count + (size_t)i];           \
				if (op == MPI_SUM)                                        \
					v += w;                                           \
				else if (op == MPI_MAX)                                   \
					v = w > v ? w : v;                                \
				else                                                      \
					v = w < v ? w : v;                                \
			}                                                                 \
			o[i] = v;                                                         \
		}                                                                         \
	} while (0)

int rmoe_sim_MPI_Allreduce(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm)
{
	const int n = comm_size(comm);
	const size_t es = type_size(type), bytes = es * (size_t)count;
	if (es == 0)
		return MPI_ERR_TYPE;
	if (op != MPI_SUM && op != MPI_MAX && op != MPI_MIN)
		return MPI_ERR_OP;
	void *all = malloc((size_t)n * bytes + 1);
	if (!all)
		return MPI_ERR_NO_MEM;
	int rc = allgather_bytes(in == MPI_IN_PLACE ? out : in, bytes, all, comm);
	if (rc != MPI_SUCCESS) {
		free(all);
		return rc;
	}
	if (!starpu_is_initialized() && n > 1) {
		memmove(out, (char *)all + (size_t)world_rank() * bytes, bytes);
	} else if (type == MPI_INT || type == MPI_INT32_T) {
		REDUCE_AS(int32_t);
	} else if (type == MPI_UINT32_T) {
		REDUCE_AS(uint32_t);
	} else if (type == MPI_INT64_T || type == MPI_LONG_LONG || type == MPI_LONG) {
		REDUCE_AS(int64_t);
	} else if (type == MPI_UINT64_T) {
		REDUCE_AS(uint64_t);
	} else if (type == MPI_DOUBLE) {
		REDUCE_AS(double);
	} else {
		REDUCE_AS(float);
	}
	free(all);
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Reduce(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, int root,
                        MPI_Comm comm)
{
	void *tmp = malloc(type_size(type) * (size_t)count + 1);
	if (!tmp)
		return MPI_ERR_NO_MEM;
	int rc = rmoe_sim_MPI_Allreduce(in == MPI_IN_PLACE ? out : in, tmp, count, type, op, comm);
	if (rc == MPI_SUCCESS && out && (comm == SIM_SELF || world_rank() == root))
		memcpy(out, tmp, type_size(type) * (size_t)count);
	free(tmp);
	return rc;
}

int rmoe_sim_MPI_Allgather(const void *in, int scount, MPI_Datatype stype, void *out, int rcount,
                           MPI_Datatype rtype, MPI_Comm comm)
{
	(void)rcount;
	(void)rtype;
	if (type_size(stype) == 0)
		return MPI_ERR_TYPE;
	return allgather_bytes(in, type_size(stype) * (size_t)scount, out, comm);
}

int rmoe_sim_MPI_Gather(const void *in, int scount, MPI_Datatype stype, void *out, int rcount,
                        MPI_Datatype rtype, int root, MPI_Comm comm)
{
	(void)rcount;
	(void)rtype;
	size_t bytes = type_size(stype) * (size_t)scount;
	if (bytes == 0 && scount > 0)
		return MPI_ERR_TYPE;
	void *all = malloc((size_t)comm_size(comm) * bytes + 1);
	if (!all)
		return MPI_ERR_NO_MEM;
	int rc = allgather_bytes(in, bytes, all, comm);
	if (rc == MPI_SUCCESS && out && (comm == SIM_SELF || world_rank() == root))
		memcpy(out, all, (size_t)comm_size(comm) * bytes);
	free(all);
	return rc;
}

int rmoe_sim_MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm)
{
	const int n = comm_size(comm);
	const size_t bytes = type_size(type) * (size_t)count;
	int64_t tag = SIM_TAG_BASE + sim_seq++;
	if (bytes == 0 && count > 0)
		return MPI_ERR_TYPE;
	if (n == 1 || !starpu_is_initialized())
		return MPI_SUCCESS;
	int rc = MPI_SUCCESS;
	if (world_rank() == root) {
		for (int q = 0; q < n && rc == MPI_SUCCESS; q++)
			if (q != root)
				rc = xfer(buf, bytes, q, tag, 1);
	} else {
		rc = xfer(buf, bytes, root, tag, 0);
	}
	return rc;
}

int rmoe_sim_MPI_Barrier(MPI_Comm comm)
{
	int z = 0, all = 0;
	return rmoe_sim_MPI_Allreduce(&z, &all, 1, MPI_INT, MPI_SUM, comm);
}

/* The non-blocking ones complete at once (the bounded waits of collective.c
 * then find them done). */
int rmoe_sim_MPI_Iallreduce(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                            MPI_Request *req)
{
	*req = MPI_REQUEST_NULL;
	return rmoe_sim_MPI_Allreduce(in, out, count, type, op, comm);
}

int rmoe_sim_MPI_Ibcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm, MPI_Request *req)
{
	*req = MPI_REQUEST_NULL;
	return rmoe_sim_MPI_Bcast(buf, count, type, root, comm);
}

int rmoe_sim_MPI_Iallgather(const void *in, int scount, MPI_Datatype stype, void *out, int rcount,
                            MPI_Datatype rtype, MPI_Comm comm, MPI_Request *req)
{
	*req = MPI_REQUEST_NULL;
	return rmoe_sim_MPI_Allgather(in, scount, stype, out, rcount, rtype, comm);
}

int rmoe_sim_MPI_Test(MPI_Request *req, int *flag, MPI_Status *status)
{
	(void)status;
	*req = MPI_REQUEST_NULL;
	*flag = 1;
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Wait(MPI_Request *req, MPI_Status *status)
{
	(void)status;
	*req = MPI_REQUEST_NULL;
	return MPI_SUCCESS;
}

/* ---- environment ------------------------------------------------------------ */

/* StarPU-MPI initialised SMPI (thread level: SimGrid runs one simulated
 * thread at a time, so any may call) and finalizes it at its shutdown. */
int rmoe_sim_MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
	(void)argc;
	(void)argv;
	(void)required;
	*provided = MPI_THREAD_MULTIPLE;
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Initialized(int *flag)
{
	*flag = 1;
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Query_thread(int *provided)
{
	*provided = MPI_THREAD_MULTIPLE;
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Finalize(void)
{
	return MPI_SUCCESS;
}

double rmoe_sim_MPI_Wtime(void)
{
	return starpu_timing_now() * 1e-6;
}

/* Each simulated rank is a node of its own to the planner: the platform,
 * not the host name, says where it runs. */
int rmoe_sim_MPI_Get_processor_name(char *name, int *len)
{
	*len = snprintf(name, MPI_MAX_PROCESSOR_NAME, "sim-rank-%d", world_rank());
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Comm_rank(MPI_Comm comm, int *rank)
{
	*rank = comm == SIM_SELF ? 0 : world_rank();
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Comm_size(MPI_Comm comm, int *size)
{
	*size = comm_size(comm);
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Comm_dup(MPI_Comm comm, MPI_Comm *out)
{
	*out = comm;
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Comm_free(MPI_Comm *comm)
{
	*comm = MPI_COMM_NULL;
	return MPI_SUCCESS;
}

int rmoe_sim_MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm *out)
{
	(void)comm;
	(void)type;
	(void)key;
	(void)info;
	*out = SIM_SELF;
	return MPI_SUCCESS;
}
