/* Striped crossing hops (beyond the paper): the ring moves in lock step,
 * so a hop lasts as long as its slowest edge, and an edge that leaves a
 * node crosses it through one network adapter while the node's others sit
 * idle (MareNostrum 5 has one per GPU: scheduler/clusters/mn5-acc.cluster).
 * Split that hop's cargo into a stripe per adapter: stripe j goes from the
 * sender over the node's GPU link to the rank that owns adapter j, over
 * that rank's network link to its counterpart on the next node, and over
 * that node's GPU link to the receiver; stripe 0 is the sender's own,
 * straight to the receiver. The crossing then takes about 1/S of its
 * time. These are the plan's decisions: which ranks relay which stripe,
 * and what the edge becomes for the bound. */
#include <stdlib.h>
#include <string.h>

#include "rmoe_plan.h"

/* The adapters a node's stripes may use: the description's, else one per
 * rank (each GPU its own adapter, as the link table assumes without one). */
static int node_adapters(const struct rmoe_topology *t, int ranks_on_node)
{
	return t->nics_per_node > 0 ? t->nics_per_node : ranks_on_node;
}

/* The ranks of node v in ring order starting at position `at` (a rank of
 * v): at most max of them, the one at `at` first. */
static int node_ranks_from(const struct rmoe_topology *t, const int *order, int at, int max, int *out)
{
	const int n = t->nranks, v = t->node[order[at]];
	int k = 0;
	for (int i = 0; i < n && k < max; i++) {
		int r = order[(at + i) % n];
		if (t->node[r] == v)
			out[k++] = r;
	}
	return k;
}

static int ranks_on(const struct rmoe_topology *t, int v)
{
	int k = 0;
	for (int r = 0; r < t->nranks; r++)
		k += t->node[r] == v;
	return k;
}

int rmoe_ring_stripes(const struct rmoe_topology *t, const int *order, int requested, int *count,
                      struct rmoe_stripe *stripes)
{
	if (!t || !order || !count || !stripes || t->nranks < 1 || !t->node)
		return rmoe_error(RMOE_EINVAL, "rmoe_ring_stripes: expected a topology, its order and outputs");
	if (requested < 0 || requested > RMOE_STRIPES_MAX)
		return rmoe_error(RMOE_EINVAL, "stripes = %d: expected 0 (as planned) or 1 to %d", requested,
		                  RMOE_STRIPES_MAX);
	const int n = t->nranks;
	/* Only where a node has one crossing edge out and one in (the planned
	 * order; rank order over interleaved ranks has more): each of its
	 * ranks then relays at most one stripe each way per hop, and its
	 * adapters serve that edge alone. */
	int *out_edges, *in_edges;
	int rc = rmoe_ring_node_edges(t, order, &out_edges, &in_edges);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		const int from = order[i], to = order[(i + 1) % n];
		struct rmoe_stripe *s = stripes + (size_t)i * RMOE_STRIPES_MAX;
		s[0] = (struct rmoe_stripe){from, to};
		count[i] = 1;
		if (n < 2 || t->node[from] == t->node[to] || requested == 1 || out_edges[t->node[from]] > 1 ||
		    in_edges[t->node[to]] > 1)
			continue;
		const int a = ranks_on(t, t->node[from]), b = ranks_on(t, t->node[to]);
		int S = node_adapters(t, a) < node_adapters(t, b) ? node_adapters(t, a) : node_adapters(t, b);
		S = S < a ? S : a;
		S = S < b ? S : b;
		S = S < RMOE_STRIPES_MAX ? S : RMOE_STRIPES_MAX;
		if (requested > 0 && requested < S)
			S = requested;
		int out[RMOE_STRIPES_MAX], in[RMOE_STRIPES_MAX];
		node_ranks_from(t, order, i, S, out);
		node_ranks_from(t, order, (i + 1) % n, S, in);
		for (int j = 0; j < S; j++)
			s[j] = (struct rmoe_stripe){out[j], in[j]};
		count[i] = S;
	}
	free(out_edges);
	free(in_edges);
	return 0;
}

int rmoe_ring_stripes_most(const int *count, int n)
{
	int most = 1;
	for (int i = 0; i < n; i++)
		most = count[i] > most ? count[i] : most;
	return most;
}

void rmoe_ring_edges_striped(const struct rmoe_topology *t, const int *count, struct rmoe_ring_edge *edges)
{
	const struct rmoe_link *gpu = &t->link[t->gpu_link];
	const struct rmoe_link *net = &t->link[RMOE_LINK_NETWORK];
	for (int i = 0; i < t->nranks; i++) {
		struct rmoe_ring_edge *e = &edges[i];
		const int S = count[i];
		if (S < 2)
			continue;
		/* Each stripe is 1/S of the cargo on each of its legs, all legs
		 * at once: S times the slower of the edge's network share and
		 * the GPU link; but the node's adapters carry every edge that
		 * leaves it, so no more than their sum over those edges. */
		double leg = e->bandwidth_gbs < gpu->bandwidth_gbs ? e->bandwidth_gbs : gpu->bandwidth_gbs;
		double bw = S * leg;
		const int sharing = e->sharing > 1 ? e->sharing : 1;
		double node = node_adapters(t, ranks_on(t, t->node[e->from])) * net->bandwidth_gbs / sharing;
		e->bandwidth_gbs = bw < node ? bw : node;
		/* A relayed stripe crosses the GPU link on both nodes. */
		e->latency_us += 2.0 * gpu->latency_us;
	}
}
