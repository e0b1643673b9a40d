/* Everything in graph/ that waits for other ranks, in one place: the waits
 * a collective call makes (for another rank's data, for StarPU's tasks, for
 * an MPI collective), bounded by the layer's wait_timeout, and the rank
 * agreements built on them. */
#ifndef RMOE_COLLECTIVE_H
#define RMOE_COLLECTIVE_H

#include <mpi.h>
#include <starpu.h>
#include <stdint.h>

#include "relaymoe/relaymoe.h"

/* The waits of one collective call, passed down to every wait it makes
 * (never a thread's or the process's: two calls, on one thread or two,
 * share nothing). A wait that makes no progress for timeout seconds (0:
 * plain blocking waits) gives up with RMOE_EPEER: a rank died, hangs or
 * stopped calling the layer. count: the waits made through it (each
 * function below counts one, whether it blocked or found its data ready;
 * the layer reports those of a pass's dispatch graph,
 * rmoe_layer_stats.host_waits_*). missing: after a collective's timeout,
 * the ranks it still waited for (rmoe_wait_missing). */
#define RMOE_WAIT_MISSING_MAX 64
struct rmoe_wait {
	double timeout;
	int64_t count;
	int nmissing;                        /* -1: the last RMOE_EPEER was another kind of wait's */
	int missing[RMOE_WAIT_MISSING_MAX];
};

/* A fresh wait state with the given timeout (seconds; <= 0 or not finite:
 * none). */
struct rmoe_wait rmoe_wait_make(double timeout);

/* starpu_data_acquire(_on_node) within the timeout. On RMOE_EPEER the
 * acquisition is abandoned (its callback may still run later). */
int rmoe_acquire_bounded(struct rmoe_wait *w, starpu_data_handle_t h, int node,
                         enum starpu_data_access_mode mode, const char *what);
/* Waits until every task and transfer writing h has completed. */
int rmoe_wait_data(struct rmoe_wait *w, starpu_data_handle_t h);
/* starpu_task_wait_for_all within the timeout. */
int rmoe_wait_tasks(struct rmoe_wait *w, const char *what);

/* MPI_Allreduce, MPI_Bcast, MPI_Allgather within the timeout. With a
 * timeout they are made of point-to-point messages (each rank sends its
 * contribution to every rank that needs it), so that one that gives up
 * names the ranks whose contribution never came or who never took its own. */
int rmoe_allreduce_bounded(struct rmoe_wait *w, const void *in, void *out, int count, MPI_Datatype type,
                           MPI_Op op, MPI_Comm comm,
                           const char *what);
int rmoe_bcast_bounded(struct rmoe_wait *w, void *buf, int count, MPI_Datatype type, int root,
                       MPI_Comm comm, const char *what);
int rmoe_allgather_bounded(struct rmoe_wait *w, const void *in, void *out, int count, MPI_Datatype type, MPI_Comm comm,
                           const char *what);

/* The ranks this rank still waited for in the collective whose timeout
 * gave w's last RMOE_EPEER: up to max of them into ranks; returns how many
 * (at most RMOE_WAIT_MISSING_MAX), or -1 when that RMOE_EPEER came from
 * another kind of wait (or there was none). */
int rmoe_wait_missing(const struct rmoe_wait *w, int *ranks, int max);

/* Every rank learns whether every rank succeeded: no rank proceeds (and
 * hangs later in a collective) while another has failed. A rank that did
 * not fail returns the worst code with "another rank failed <what>". */
int rmoe_agree(struct rmoe_wait *w, MPI_Comm comm, int rc, const char *what);

/* As rmoe_agree, and every rank returns the same code and message: those of
 * the lowest failing rank, prefixed with its number, so that a bad value one
 * rank found is named on all of them. */
int rmoe_agree_first(struct rmoe_wait *w, MPI_Comm comm, int rc, const char *what);

/* As rmoe_agree_first, in one collective with every rank's value: all
 * [ranks] holds them when every rank succeeded. */
int rmoe_agree_first_gather(struct rmoe_wait *w, MPI_Comm comm, int rc, const char *what, int64_t value,
                            int64_t *all);

/* 1 when digest is the same on every rank, 0 when it is not, or a negative
 * RMOE_E* code: ranks that must hold the same value (a configuration, a
 * plan) compare a digest of it. */
int rmoe_agree_digest(struct rmoe_wait *w, MPI_Comm comm, uint64_t digest, const char *what);

#endif /* RMOE_COLLECTIVE_H */
