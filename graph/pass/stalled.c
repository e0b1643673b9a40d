/* The message of a pass that stalled (RMOE_EPEER): which peers this rank
 * waited for, with their hosts. */
#include <stdio.h>

#include "rmoe_collective.h"
#include "rmoe_pass.h"

/* Appends ", rank R on host H" (no comma first) to who[cap]; *n counts them. */
static void append_rank(char *who, size_t cap, size_t *used, int *n, const struct rmoe_topology *t, int rank)
{
	if (*used >= cap)
		return;
	const char *h = rmoe_topology_host(t, rank);
	*used += (size_t)snprintf(who + *used, cap - *used, "%srank %d on host %s", *n ? ", " : "", rank, h ? h : "?");
	(*n)++;
}

/* The peers of the earliest watched transfers (lowest tag) that have not
 * completed, with their hosts, into *rc; 0 when every watched transfer has
 * completed. Transfers of later tags may wait only because of those: an
 * exchange is posted once the one before it has completed. */
static int stalled_peers(const struct rmoe_layer *L, const struct rmoe_pass *pass, const char *why, int *rc)
{
	/* The status, not starpu_task_finished(), which takes only tasks that
	 * are waited for (detach = 0); read after a timeout, long past a race. */
#define PENDING(w) ((w)->fence->status != STARPU_TASK_FINISHED)
	const struct rmoe_watch *first = NULL;
	for (int i = 0; i < pass->nwatched; i++)
		if (PENDING(&pass->watched[i]) && (!first || pass->watched[i].tag < first->tag))
			first = &pass->watched[i];
	if (!first)
		return 0;
	const struct rmoe_topology *t = &L->ctx->topo;
	const char *my_host = rmoe_topology_host(t, L->ctx->rank);
	char who[256] = "";
	size_t used = 0;
	int n = 0;
	for (int i = 0; i < pass->nwatched; i++) {
		const struct rmoe_watch *w = &pass->watched[i];
		int seen = 0;
		for (int j = 0; j < i; j++)
			seen |= pass->watched[j].peer == w->peer && pass->watched[j].tag == w->tag && PENDING(&pass->watched[j]);
		if (w->tag == first->tag && !seen && PENDING(w))
			append_rank(who, sizeof(who), &used, &n, t, w->peer);
	}
	*rc = rmoe_error(RMOE_EPEER, "%s pass stalled waiting for %s exchanged with %s, this rank (%d on %s): %s",
	                 pass->backward ? "backward" : "forward", first->what, who, L->ctx->rank,
	                 my_host ? my_host : "?", why);
	return n;
#undef PENDING
}

int rmoe_pass_peer_named(const struct rmoe_layer *L, const struct rmoe_pass *pass, int rc)
{
	if (rc != RMOE_EPEER || L->N < 2)
		return rc;
	char why[512];
	snprintf(why, sizeof(why), "%s", rmoe_strerror(rc));
	const struct rmoe_topology *t = &L->ctx->topo;
	const char *my_host = rmoe_topology_host(t, L->ctx->rank);
	int missing[4], m = rmoe_wait_missing(pass->wait, missing, 4);
	if (m == 0)
		return rc;   /* a vote that completed as it timed out */
	if (m > 0) {
		/* A vote of all ranks: the ranks whose vote never came (lost,
		 * stuck in the pass before, or cut off), with their hosts. */
		char who[256] = "";
		size_t used = 0;
		int n = 0;
		for (int i = 0; i < m && i < 4; i++)
			append_rank(who, sizeof(who), &used, &n, t, missing[i]);
		return rmoe_error(RMOE_EPEER, "%s vote stalled waiting for %s%s, this rank (%d on %s): %s",
		                  pass->backward ? "backward" : "forward", who, m > 4 ? ", ..." : "", L->ctx->rank,
		                  my_host ? my_host : "?", why);
	}
	if (stalled_peers(L, pass, why, &rc))
		return rc;
	if (rmoe_dispatch_alltoall(L->dispatch))
		return rc;
	/* A ring hop waits for one rank only: the left neighbour, the sender
	 * of every relay this rank receives. When data stops, it is that rank
	 * or a rank before it on the ring that was lost. */
	const char *left_host = rmoe_topology_host(t, L->left);
	return rmoe_error(RMOE_EPEER,
	                  "%s pass stalled waiting for rank %d on host %s (node %d), the left neighbour whose relay "
	                  "this rank (%d on %s) receives: %s",
	                  pass->backward ? "backward" : "forward", L->left, left_host ? left_host : "?",
	                  t->node[L->left], L->ctx->rank, my_host ? my_host : "?", why);
}
