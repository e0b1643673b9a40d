/* The all-to-alls' exchange order: which peer a rank sends its block to,
 * and which peer's block it receives, at each step. Every step is a
 * permutation of the ranks, so no rank receives two blocks in one step.
 * The pairwise order (me + k, me - k) is one; on several nodes it mixes
 * node-crossing blocks with NVLink ones in every step, and the four ranks
 * of a node may all send to one rank of the next node at once, sharing its
 * adapter while the node's others idle. Ordered by node instead, the steps
 * inside the node come first (they finish fast and feed the experts while
 * the slow ones travel), then each other node at shift s with the node's
 * slots shifted by t: in such a step every rank of a node sends to a
 * different rank of one other node, so each adapter carries one block
 * each way. The all-to-all graphs submit their steps in this order
 * (graph/dispatch/alltoall_plan.c). */
#include <stdlib.h>
#include <string.h>

#include "rmoe_plan.h"

/* Nodes of equal size: slot[r] (r's index among its node's ranks) and
 * member[node * R + slot]; 0 when the nodes differ in size. fill: M
 * counters of the caller's. */
static int equal_nodes(const struct rmoe_topology *t, int *slot, int *member, int *fill)
{
	const int N = t->nranks, M = t->nnodes;
	if (M < 1 || N % M)
		return 0;
	const int R = N / M;
	memset(fill, 0, sizeof(int) * (size_t)M);
	for (int r = 0; r < N; r++) {
		const int n = t->node[r];
		if (n < 0 || n >= M || fill[n] >= R)
			return 0;
		slot[r] = fill[n];
		member[n * R + fill[n]++] = r;
	}
	return 1;
}

int rmoe_exchange_order(const struct rmoe_topology *t, int me, int *to, int *from)
{
	if (!t || !to || !from || t->nranks < 1 || !t->node || me < 0 || me >= t->nranks)
		return rmoe_error(RMOE_EINVAL, "rmoe_exchange_order: expected a topology and a rank in it");
	const int N = t->nranks, M = t->nnodes;
	int *slot = malloc(sizeof(int) * (size_t)(2 * N + (M > 0 ? M : 0)));
	if (!slot)
		return rmoe_error(RMOE_ENOMEM, "out of host memory ordering %d ranks' exchanges", N);
	int *member = slot + N;
	if (M < 2 || !equal_nodes(t, slot, member, member + N))
		for (int k = 0; k < N; k++) {
			to[k] = (me + k) % N;
			from[k] = (me - k + N) % N;
		}
	else {
		const int R = N / M, n = t->node[me], l = slot[me];
		int k = 0;
		/* s = 0 first: the own block (u = 0), then the node's others. */
		for (int s = 0; s < M; s++)
			for (int u = 0; u < R; u++, k++) {
				to[k] = member[((n + s) % M) * R + (l + u) % R];
				from[k] = member[((n - s + M) % M) * R + (l - u + R) % R];
			}
	}
	free(slot);
	return 0;
}
