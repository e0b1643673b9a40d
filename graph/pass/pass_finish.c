/* The end of a pass: the relay buffers it holds until then, the wait for
 * its outputs, tasks and last transfers, and the release of what it kept. */
#include <stdlib.h>
#include <string.h>

#include "rmoe_collective.h"
#include "rmoe_pass.h"

int rmoe_pass_room(void *items, int *cap, int count, size_t size, int first)
{
	if (count < *cap)
		return 0;
	const int grown = *cap ? 2 * *cap : first;
	void *a;
	memcpy(&a, items, sizeof(a));
	a = realloc(a, (size_t)grown * size);
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	memcpy(items, &a, sizeof(a));
	*cap = grown;
	return 0;
}

int rmoe_pass_hold(struct rmoe_pass *pass, starpu_data_handle_t h)
{
	int rc = rmoe_pass_room(&pass->held, &pass->capheld, pass->nheld, sizeof(*pass->held), 8);
	if (rc) {
		/* Not held: freed when its last user ends, which is also correct. */
		starpu_data_unregister_submit(h);
		return rc;
	}
	pass->held[pass->nheld++] = h;
	return 0;
}

/* Drops the partition plans of the pass's striped transfers (stripes.c);
 * its relays' slots are held, so unregistered with the rest. */
static void stripes_release(struct rmoe_pass *pass)
{
	for (int i = 0; i < pass->nsplits; i++)
		starpu_data_partition_clean(pass->splits[i].parent, (unsigned)pass->splits[i].n, pass->splits[i].pieces);
	free(pass->splits);
	pass->splits = NULL;
	pass->nsplits = pass->capsplits = 0;
	free(pass->relays);
	pass->relays = NULL;
	pass->nrelays = pass->caprelays = 0;
}

/* Destroys the pass's dependency anchors and unregisters the buffers it
 * holds; after every task has ended. */
static void pass_release(struct rmoe_pass *pass)
{
	for (int i = 0; i < pass->nanchors; i++)
		starpu_task_destroy(pass->anchors[i]);
	free(pass->anchors);
	pass->anchors = NULL;
	pass->nanchors = pass->capanchors = 0;
	pass->window = pass->gate = NULL;
	/* The pieces before their parents, which may be held. */
	stripes_release(pass);
	for (int i = 0; i < pass->nheld; i++)
		starpu_data_unregister(pass->held[i]);
	free(pass->held);
	pass->held = NULL;
	pass->nheld = pass->capheld = 0;
	for (int i = 0; i < pass->nowned; i++)
		free(pass->owned[i]);
	free(pass->owned);
	pass->owned = NULL;
	pass->nowned = pass->capowned = 0;
	for (int i = 0; i < pass->nwatched; i++)
		starpu_task_destroy(pass->watched[i].fence);
	free(pass->watched);
	pass->watched = NULL;
	pass->nwatched = pass->capwatched = 0;
	/* Their handles were held, so unregistered above. */
	free(pass->credits);
	pass->credits = NULL;
	pass->ncredits = pass->capcredits = 0;
}

int rmoe_pass_finish(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *outs, int nouts)
{
	int rc;
	/* Waits for the outputs where they are: a device's stay there until
	 * the application reads them (unregistering an application's buffer,
	 * or rmoe_layer_get_grad_*, brings them home). */
	for (int i = 0; i < nouts; i++)
		if (outs[i]) {
			if ((rc = rmoe_acquire_bounded(pass->wait, outs[i], STARPU_ACQUIRE_NO_NODE, STARPU_R, "the pass's outputs")) ==
			    RMOE_EPEER)
				return rc;
			if (!rc)
				starpu_data_release_on_node(outs[i], STARPU_ACQUIRE_NO_NODE);
		}
	if ((rc = rmoe_wait_tasks(pass->wait, "the pass's tasks and transfers")))
		return rc;
	/* A held relay buffer may still be in a send to the next rank, which
	 * no task count shows; unregistering would wait for it without bound.
	 * A write access waits for every earlier one, needs no initialised
	 * contents (a receive buffer the pass never filled) and, on no node,
	 * moves no data. */
	for (int i = 0; i < pass->nheld; i++) {
		rc = rmoe_acquire_bounded(pass->wait, pass->held[i], STARPU_ACQUIRE_NO_NODE, STARPU_W, "a relay buffer's last send");
		if (rc == RMOE_EPEER)
			return rc;
		if (!rc)
			starpu_data_release_on_node(pass->held[i], STARPU_ACQUIRE_NO_NODE);
	}
	pass_release(pass);
	/* A write access waits for the weights' last send; on no node it
	 * moves them nowhere (an access on main memory would invalidate the
	 * device's copy, and the next pass would upload all the weights). */
	if ((rc = rmoe_acquire_bounded(pass->wait, L->h_w_part, STARPU_ACQUIRE_NO_NODE, STARPU_RW, "the weights' last transfer")) ==
	    RMOE_EPEER)
		return rc;
	if (!rc)
		starpu_data_release_on_node(L->h_w_part, STARPU_ACQUIRE_NO_NODE);
	return 0;
}
