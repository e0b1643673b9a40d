/* The transfers of a pass: StarPU-MPI detached requests on the context's
 * communicator, counted; the watch of a transfer, for the message of a
 * stalled pass; and the exchange of every rank's expert counts. */
#include <stdlib.h>
#include <string.h>

#include <starpu_mpi.h>

#include "rmoe_buffers.h"
#include "rmoe_collective.h"
#include "rmoe_tasks.h"
#include "rmoe_transfers.h"

int rmoe_send(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int dest, int64_t tag,
              int prio, void (*done)(void *), void *arg)
{
	int ret = starpu_mpi_isend_detached_prio(h, dest, tag, prio, L->ctx->comm, done, arg);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_mpi_isend_detached to rank %d (tag %lld) failed (%d)", dest,
		                  (long long)tag, ret);
	rmoe_bookkeeping_count_request(1);
	pass->bytes_sent += (int64_t)starpu_data_get_size(h);
	return 0;
}

int rmoe_recv(struct rmoe_layer *L, starpu_data_handle_t h, int src, int64_t tag)
{
	int ret = starpu_mpi_irecv_detached(h, src, tag, L->ctx->comm, NULL, NULL);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_mpi_irecv_detached from rank %d (tag %lld) failed (%d)", src,
		                  (long long)tag, ret);
	rmoe_bookkeeping_count_request(0);
	return 0;
}

int rmoe_pass_watch(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int peer, int64_t tag,
                    int received, const char *what)
{
	/* Without a timeout no wait gives up, so there is no stall to name: no
	 * task is added to the pass. */
	if (L->cfg.wait_timeout <= 0)
		return 0;
	if (pass->nwatched == pass->capwatched) {
		int cap = pass->capwatched ? 2 * pass->capwatched : 16;
		struct rmoe_watch *a = realloc(pass->watched, (size_t)cap * sizeof(*a));
		if (!a)
			return rmoe_error(RMOE_ENOMEM, "out of host memory");
		pass->watched = a;
		pass->capwatched = cap;
	}
	struct rmoe_task_opts o = rmoe_opts(L, "watch", 0);
	struct starpu_task *t = NULL;
	o.kept = &t;
	/* After a receive, a read: it waits for that writer only. After a
	 * send, a write waits for the send's read; the buffer's later users
	 * (its unregistration) come after the send anyway. */
	int rc = rmoe_insert_fence(&o, &h, received ? 1 : 0, &h, received ? 0 : 1);
	if (!rc)
		pass->watched[pass->nwatched++] = (struct rmoe_watch){t, peer, tag, what};
	return rc;
}

int64_t rmoe_counts_width(const struct rmoe_layer *L)
{
	return L->dispatch == RMOE_DISPATCH_ALLTOALL_DEEPEP ? L->E + L->N : L->E;
}

starpu_data_handle_t rmoe_counts_handle(const struct rmoe_layer *L, int32_t **host)
{
	const int deepep = L->dispatch == RMOE_DISPATCH_ALLTOALL_DEEPEP;
	*host = deepep ? L->peer_counts : L->expert_counts;
	return deepep ? L->h_peer_counts : L->h_counts;
}

void rmoe_sim_rank_counts(const struct rmoe_layer *L, int rank, int32_t *out)
{
	rmoe_sim_expert_counts(L->T, L->K, L->E, rank, out);
	if (rmoe_counts_width(L) > L->E)
		rmoe_sim_peer_tokens(L->T, L->K, L->E, L->N, out, out + L->E);
}

int rmoe_exchange_counts(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, int32_t *all)
{
	const int N = L->N, me = L->ctx->rank;
	const int64_t W = rmoe_counts_width(L);
	int32_t *mine_host;
	starpu_data_handle_t mine = rmoe_counts_handle(L, &mine_host);
	starpu_data_handle_t *hc = calloc((size_t)N, sizeof(*hc));
	if (!hc)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int rc = 0;
	for (int q = 0; q < N && !rc; q++) {
		if (q == me)
			continue;
		hc[q] = rmoe_host_vector(NULL, all + (int64_t)q * W, W, sizeof(int32_t));
		rc = rmoe_send(L, pass, mine, q, tag, 0, NULL, NULL);
		if (!rc)
			rc = rmoe_recv(L, hc[q], q, tag);
		if (!rc)
			rc = rmoe_pass_watch(L, pass, hc[q], q, tag, 1, "the expert counts");
	}
	/* Unregistering waits for each receive; a bounded wait first, so that a
	 * dead peer gives RMOE_EPEER (its handle is then left registered). */
	for (int q = 0; q < N; q++)
		if (hc[q] && !rc) {
			int wrc = rmoe_wait_data(pass->wait, hc[q]);
			if (wrc == RMOE_EPEER) {
				free(hc);
				return wrc;
			}
			rc = wrc;
		}
	for (int q = 0; q < N; q++)
		if (hc[q])
			starpu_data_unregister(hc[q]);
	free(hc);
	if (rc)
		return rc;
	memcpy(all + (int64_t)me * W, mine_host, (size_t)W * sizeof(int32_t));
#ifdef STARPU_SIMGRID
	/* What was sent is synthetic; each rank draws every rank's counts
	 * itself, so the plans agree whatever the transfers carried. */
	for (int q = 0; q < N; q++)
		rmoe_sim_rank_counts(L, q, all + (int64_t)q * W);
#endif
	return 0;
}

#ifndef STARPU_SIMGRID
/* A StarPU-MPI request's structures, for the bookkeeping term
 * (codelets/bookkeeping.c): receives and then sends of one-value vectors
 * from and to this rank itself, on tags of the context's window before any
 * pass has one, each measured as the heap's growth while they are posted. */
int rmoe_requests_measure(rmoe_ctx *ctx)
{
	enum { COUNT = 32 };
	static float values[COUNT];
	starpu_data_handle_t src[COUNT], dst[COUNT];
	starpu_mpi_req rreq[COUNT], sreq[COUNT];
	int64_t base;
	int rc = rmoe_tags_reserve(ctx, COUNT, &base);
	if (rc)
		return rc;
	for (int i = 0; i < COUNT; i++) {
		values[i] = (float)i;
		starpu_vector_data_register(&src[i], STARPU_MAIN_RAM, (uintptr_t)&values[i], 1, sizeof(float));
		starpu_vector_data_register(&dst[i], -1, 0, 1, sizeof(float));
	}
	int nr = 0, ns = 0;
	int64_t before = rmoe_heap_current();
	while (nr < COUNT && starpu_mpi_irecv(dst[nr], &rreq[nr], ctx->rank, base + nr, ctx->comm) == 0)
		nr++;
	int64_t posted = rmoe_heap_current();
	while (ns < nr && starpu_mpi_isend(src[ns], &sreq[ns], ctx->rank, base + ns, ctx->comm) == 0)
		ns++;
	int64_t sent = rmoe_heap_current();
	if (nr > 0 && ns > 0)
		rmoe_bookkeeping_set_requests((sent - posted) / ns, (posted - before) / nr);
	MPI_Status st;
	for (int i = 0; i < ns; i++)
		starpu_mpi_wait(&sreq[i], &st);
	/* A receive without its send would never end: each has its send. */
	for (int i = 0; i < ns; i++)
		starpu_mpi_wait(&rreq[i], &st);
	if (ns < nr)
		rc = rmoe_error(RMOE_ESTARPU, "starpu_mpi_isend to this rank itself failed measuring its requests");
	else if (nr < COUNT)
		rc = rmoe_error(RMOE_ESTARPU, "starpu_mpi_irecv from this rank itself failed measuring its requests");
	/* Submitted, not waited for: a receive left without its send (a
	 * failed isend) would hold its handle forever. */
	for (int i = 0; i < COUNT; i++) {
		starpu_data_unregister_submit(src[i]);
		starpu_data_unregister_submit(dst[i]);
	}
	/* The window starts again at its first tag, so the first pass's block
	 * decodes as the first (scripts/trace). */
	rmoe_tags_init(ctx);
	return rc;
}
#else
int rmoe_requests_measure(rmoe_ctx *ctx)
{
	(void)ctx;
	return 0;
}
#endif
