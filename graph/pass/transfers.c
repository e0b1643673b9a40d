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
	if (rmoe_pass_room(&pass->watched, &pass->capwatched, pass->nwatched, sizeof(*pass->watched), 16))
		return RMOE_ENOMEM;
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
	return L->traits->peer_counts ? L->E + L->N : L->E;
}

starpu_data_handle_t rmoe_counts_handle(const struct rmoe_layer *L, int32_t **host)
{
	const int peers = L->traits->peer_counts;
	*host = peers ? L->peer_counts : L->expert_counts;
	return peers ? L->h_peer_counts : L->h_counts;
}

void rmoe_sim_rank_counts(const struct rmoe_layer *L, int rank, int32_t *out)
{
	rmoe_sim_expert_counts(L->rank_tokens[rank], L->K, L->E, rank, out);
	if (rmoe_counts_width(L) > L->E)
		rmoe_sim_peer_tokens(L->rank_tokens[rank], L->K, L->E, L->N, out, out + L->E);
}

void rmoe_counts_offsets(const int32_t *counts, int64_t n, int64_t *offsets)
{
	offsets[0] = 0;
	for (int64_t e = 0; e < n; e++)
		offsets[e + 1] = offsets[e] + counts[e];
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
