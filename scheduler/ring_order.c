/* The ring order (§3.2, "the physical topology of the ring also matters"):
 * every hop moves data between ring neighbours at once, so the slowest edge
 * paces the hop. Keeping each node's ranks contiguous makes the ring cross
 * the slow inter-node links once per node, the fewest a ring over several
 * nodes can; inside a node, ranks sharing a device sit together and devices
 * follow in order (under NVSwitch every pair is equally fast). */
#include <stdlib.h>
#include <string.h>

#include "rmoe_plan.h"

struct placed {
	int node, device, rank;
};

static int cmp_placed(const void *a, const void *b)
{
	const struct placed *x = a, *y = b;
	if (x->node != y->node)
		return (x->node > y->node) - (x->node < y->node);
	if (x->device != y->device)
		return (x->device > y->device) - (x->device < y->device);
	return (x->rank > y->rank) - (x->rank < y->rank);
}

int rmoe_ring_order(const struct rmoe_topology *t, int *order)
{
	if (!t || !order || t->nranks < 1 || !t->node || !t->device)
		return rmoe_error(RMOE_EINVAL, "rmoe_ring_order: expected a topology of at least one rank");
	struct placed *p = malloc(sizeof(*p) * (size_t)t->nranks);
	if (!p)
		return rmoe_error(RMOE_ENOMEM, "out of host memory ordering %d ranks", t->nranks);
	for (int r = 0; r < t->nranks; r++)
		p[r] = (struct placed){t->node[r], t->device[r], r};
	qsort(p, (size_t)t->nranks, sizeof(*p), cmp_placed);
	for (int i = 0; i < t->nranks; i++)
		order[i] = p[i].rank;
	free(p);
	return 0;
}

/* A node's adapters carry every ring edge that leaves it (and every one
 * that enters it) at once, since all hops of a ring move together: an edge
 * gets its share on the busier of its two ends. */
int rmoe_ring_node_edges(const struct rmoe_topology *t, const int *order, int **out, int **in)
{
	const int n = t->nranks;
	*out = calloc((size_t)t->nnodes, sizeof(int));
	*in = calloc((size_t)t->nnodes, sizeof(int));
	if (!*out || !*in) {
		free(*out);
		free(*in);
		*out = *in = NULL;
		return rmoe_error(RMOE_ENOMEM, "out of host memory counting the ring's edges between nodes");
	}
	for (int i = 0; i < n; i++)
		if (t->node[order[i]] != t->node[order[(i + 1) % n]]) {
			(*out)[t->node[order[i]]]++;
			(*in)[t->node[order[(i + 1) % n]]]++;
		}
	return 0;
}

static int share_adapters(const struct rmoe_topology *t, const int *order, struct rmoe_ring_edge *edges)
{
	int n = t->nranks, nics = t->nics_per_node, *out, *in;
	int rc = rmoe_ring_node_edges(t, order, &out, &in);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		struct rmoe_ring_edge *e = &edges[i];
		if (e->link != RMOE_LINK_NETWORK)
			continue;
		int busiest = out[t->node[e->from]] > in[t->node[e->to]] ? out[t->node[e->from]] : in[t->node[e->to]];
		e->sharing = busiest;
		if (busiest > nics)
			e->bandwidth_gbs *= (double)nics / (double)busiest;
	}
	free(out);
	free(in);
	return 0;
}

int rmoe_ring_edges(const struct rmoe_topology *t, const int *order, struct rmoe_ring_edge *edges)
{
	if (!t || !order || !edges || t->nranks < 1)
		return rmoe_error(RMOE_EINVAL, "rmoe_ring_edges: expected a topology, an order and edges");
	int n = t->nranks;
	char *seen = calloc((size_t)n, 1);
	if (!seen)
		return rmoe_error(RMOE_ENOMEM, "out of host memory checking the ring order");
	for (int i = 0; i < n; i++) {
		if (order[i] < 0 || order[i] >= n || seen[order[i]]) {
			int bad = order[i];
			free(seen);
			return rmoe_error(RMOE_EINVAL,
			                  "ring position %d holds rank %d: expected each rank 0..%d exactly once",
			                  i, bad, n - 1);
		}
		seen[order[i]] = 1;
	}
	free(seen);
	for (int i = 0; i < n; i++) {
		int a = order[i], b = order[(i + 1) % n];
		enum rmoe_link_class l = rmoe_topology_link(t, a, b);
		edges[i] = (struct rmoe_ring_edge){a, b, l, t->link[l].bandwidth_gbs, t->link[l].latency_us, 0};
	}
	return t->nics_per_node > 0 ? share_adapters(t, order, edges) : 0;
}

int rmoe_ring_node_crossings(const struct rmoe_topology *t, const int *order)
{
	int n = t->nranks, crossings = 0;
	for (int i = 0; i < n && n > 1; i++)
		crossings += t->node[order[i]] != t->node[order[(i + 1) % n]];
	return crossings;
}

double rmoe_edge_seconds(const struct rmoe_ring_edge *e, double bytes)
{
	if (e->bandwidth_gbs <= 0)
		return 0.0;
	return e->latency_us * 1e-6 + bytes / (e->bandwidth_gbs * 1e9);
}

int rmoe_ring_slowest_edge(const struct rmoe_ring_edge *edges, int n, double bytes)
{
	int worst = 0;
	for (int i = 1; i < n; i++)
		if (rmoe_edge_seconds(&edges[i], bytes) > rmoe_edge_seconds(&edges[worst], bytes))
			worst = i;
	return worst;
}
