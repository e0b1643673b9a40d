/* One pass (forward or backward) of a layer: what its graph needs to know
 * and reports back, the relay buffers it holds to its end, its end, and the
 * message naming the peer a stalled pass waited for. The helpers the
 * dispatch graphs build a pass with have headers of their own
 * (rmoe_buffers.h, rmoe_chunks.h, rmoe_transfers.h, rmoe_tasks.h). Private
 * to graph/. */
#ifndef RMOE_PASS_H
#define RMOE_PASS_H

#include <starpu.h>
#include <stdint.h>

#include "rmoe_collective.h"
#include "rmoe_layer_impl.h"

/* A transfer of a pass watched for the message of a stalled pass
 * (rmoe_pass_watch). */
struct rmoe_watch {
	struct starpu_task *fence;    /* kept; ends once the transfer has completed */
	int peer;
	int64_t tag;
	const char *what;             /* the data, in the message's words */
};

/* The StarPU-MPI tags a pass of N ranks reserves from tag_base: 8N + 8 for
 * its data (the graphs' own layouts), then RMOE_CREDIT_KINDS * N for the
 * credits of its ring (flow.c). */
#define RMOE_CREDIT_KINDS 2
#define RMOE_PASS_TAGS(N) (8 * (int64_t)(N) + 8 + RMOE_CREDIT_KINDS * (int64_t)(N))

/* A striped transfer's pieces of a buffer (stripes.c): a partition plan
 * made once a pass, submitted and undone at every use. */
struct rmoe_split {
	starpu_data_handle_t parent;
	int n;
	int sending;                  /* read-only partition active (stripes.c) */
	starpu_data_handle_t pieces[RMOE_STRIPES_MAX];
};

/* A relaying rank's buffer of one stripe (stripes.c): role 0 sends it
 * over the network, role 1 receives it from there; per relayed kind, the
 * window's slots. */
struct rmoe_relay_slot {
	int role, kind, slot;
	starpu_data_handle_t h;
};

/* What a pass's graph needs to know and what it reports back. */
struct rmoe_pass {
	int backward;
	int64_t tag_base;
	int64_t bytes_sent;
	int64_t largest_temporary;
	int64_t resident;         /* bytes registered from host memory for this pass */
	struct rmoe_wait *wait;   /* the call's waits (rmoe_collective.h) */
	int host_waits;           /* made while the dispatch graph was submitted */
	int agreed;               /* its failure is already agreed on every rank */
	int64_t oversized;        /* an element count no StarPU vector holds (buffers.c); 0: none */
	struct starpu_task *window;   /* see window.c */
	struct starpu_task *gate;     /* the next expert backward waits for it (window.c) */
	struct starpu_task **anchors;
	int nanchors, capanchors;
	starpu_data_handle_t *held;   /* relay buffers kept to the end of the pass */
	int nheld, capheld;
	struct rmoe_watch *watched;   /* transfers named when the pass stalls */
	int nwatched, capwatched;
	int32_t *credits;             /* the words of the ring's credits (flow.c) */
	int ncredits, capcredits;
	struct rmoe_split *splits;    /* striped transfers' pieces (stripes.c) */
	int nsplits, capsplits;
	struct rmoe_relay_slot *relays;   /* a relaying rank's stripe buffers (held) */
	int nrelays, caprelays;
	void **owned;                 /* host memory of held buffers, freed at the end */
	int nowned, capowned;
	int64_t owned_bytes;          /* their bytes: in resident, and in the heap's growth */
};

/* Room for one more item in a pass's growing array: *items (a pointer to
 * the array's pointer) of *cap items of size bytes, count of them used,
 * doubled when full (first items at first). 0, or RMOE_ENOMEM with the
 * array left as it was. */
int rmoe_pass_room(void *items, int *cap, int count, size_t size, int first);

/* A ring's relay buffer (weights, gradients, travelling tokens) stays
 * allocated until the pass ends instead of being freed when its last
 * transfer completes: the peak then does not depend on when the network
 * finishes a send, and the memory model can count it exactly. */
int rmoe_pass_hold(struct rmoe_pass *pass, starpu_data_handle_t h);

/* Waits for a pass: its outputs, then every task (temporaries freed), the
 * held relay buffers' last sends, and the owned weights' outgoing
 * transfers; then releases the pass's anchors and held buffers. */
int rmoe_pass_finish(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *outs, int nouts);

/* rc, and when it is RMOE_EPEER the message says which peers the rank was
 * waiting for, with their hosts: in the vote that starts a pass, the ranks
 * that never reached it; where the pass watched its transfers
 * (rmoe_pass_watch), the peers of the earliest ones (by tag) that never
 * completed; otherwise, in a ring pass, its left neighbour on the ring,
 * whose relay feeds every hop. */
int rmoe_pass_peer_named(const struct rmoe_layer *L, const struct rmoe_pass *pass, int rc);

#endif /* RMOE_PASS_H */
