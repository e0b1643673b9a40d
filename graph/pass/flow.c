/* Flow control of a ring's relay: credits through StarPU data dependencies.
 *
 * A rank that runs ahead of its right neighbour sends hop h while the
 * neighbour's slot for it still holds hop h - window: the receive cannot be
 * posted, and StarPU-MPI 1.3 keeps the arriving message in a buffer it
 * mallocs for it (_starpu_mpi_receive_early_data), outside StarPU's
 * accounting and the memory model. Without a bound a rank can run N - 2
 * hops ahead, every one a partition's weights (or a token partition) held
 * twice. So the receiver grants each hop: an ordering task after the slot's
 * last access (the readers of hop h - window) precedes both its receive and
 * a 4-byte credit to the left, and the left's send of hop h waits for that
 * credit by an ordering task of its own. Nothing waits on the host, no
 * synchronous send is used (StarPU-MPI 1.3.10's crashes under the suite),
 * and no rank receives more than window hops ahead of what it has consumed.
 *
 * The credit words are host memory of the pass, registered one per credit
 * (a detached request needs a valid copy to send) and held to its end. */
#include <stdint.h>
#include <stdlib.h>

#include "rmoe_buffers.h"
#include "rmoe_tasks.h"
#include "rmoe_transfers.h"

int rmoe_flow_reserve(struct rmoe_pass *pass, int64_t n)
{
	if (pass->credits)
		return 0;
	if (n > INT32_MAX)
		return rmoe_error(RMOE_EINVAL, "a pass asked for %lld credits", (long long)n);
	pass->capcredits = (int)(n > 0 ? n : 1);
	pass->credits = calloc((size_t)pass->capcredits, sizeof(int32_t));
	return pass->credits ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory");
}

/* A credit handle of the pass: a word of pass->credits (room for every
 * credit a ring pass exchanges, allocated at its first unless reserved). */
static int credit_handle(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *h)
{
	/* A striped ring's relays grant and await credits of their own: per
	 * hop and relayed kind (at most 8), two grants and an await a relay,
	 * an await per piece a sender (stripes.c). */
	int rc = rmoe_flow_reserve(pass, 2 * RMOE_CREDIT_KINDS * (int64_t)L->N +
	                                     (L->striped ? 8 * (3 + RMOE_STRIPES_MAX) * (int64_t)L->N : 0));
	if (rc)
		return rc;
	if (pass->ncredits == pass->capcredits)
		return rmoe_error(RMOE_EINVAL, "a pass asked for more than %d credits", pass->capcredits);
	int32_t *word = &pass->credits[pass->ncredits++];
	*word = (int32_t)pass->ncredits;
	*h = rmoe_host_vector(NULL, word, 1, sizeof(int32_t));
	return rmoe_pass_hold(pass, *h);
}

int rmoe_flow_grant_to(struct rmoe_layer *L, struct rmoe_pass *pass, int peer, int64_t tag,
                       const starpu_data_handle_t *slots, int n, struct starpu_task *after)
{
	starpu_data_handle_t credit, next[8];
	if (n + 1 > (int)(sizeof(next) / sizeof(next[0])))
		return rmoe_error(RMOE_EINVAL, "a credit covers at most 7 slots, not %d", n);
	int rc = credit_handle(L, pass, &credit);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++)
		next[i] = slots[i];
	next[n] = credit;
	/* Write accesses on no node: after every earlier access of the slots,
	 * before their receives, contents untouched. */
	rc = rmoe_pass_fence(L, pass, NULL, 0, next, n + 1, after, NULL, "credit");
	if (!rc)
		rc = rmoe_send(L, pass, credit, peer, tag, rmoe_prio_hop(0, L->N) + 1, NULL, NULL);
	return rc;
}

int rmoe_flow_grant(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, const starpu_data_handle_t *slots,
                    int n)
{
	return rmoe_flow_grant_to(L, pass, L->left, tag, slots, n, NULL);
}

int rmoe_flow_await_from(struct rmoe_layer *L, struct rmoe_pass *pass, int peer, int64_t tag,
                         starpu_data_handle_t *credit)
{
	int rc = credit_handle(L, pass, credit);
	if (!rc)
		rc = rmoe_recv(L, *credit, peer, tag);
	if (!rc)
		rc = rmoe_pass_watch(L, pass, *credit, peer, tag, 1, "a credit");
	return rc;
}

int rmoe_flow_await(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, starpu_data_handle_t *credit)
{
	return rmoe_flow_await_from(L, pass, L->right, tag, credit);
}

int rmoe_flow_gate(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t credit,
                   starpu_data_handle_t h)
{
	return rmoe_pass_fence(L, pass, &credit, 1, &h, 1, NULL, NULL, "credit-wait");
}
