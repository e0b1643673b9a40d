/* Topology: where every rank runs (node, device) and how two ranks are
 * linked. hwloc describes each machine (system/local_hw.c); the context
 * gathers what every rank saw (graph/context/discover.c); the construction here is
 * pure, so every rank derives the same topology from the same gathered
 * bytes. A cluster description can replace the live placement (simulated
 * multi-node placements on one machine). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_plan.h"

struct keyed {
	int key, rank;
};

static int cmp_keyed(const void *a, const void *b)
{
	const struct keyed *x = a, *y = b;
	if (x->key != y->key)
		return (x->key > y->key) - (x->key < y->key);
	return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Renumbers arbitrary per-rank node keys 0, 1, ... in order of first
 * appearance in rank order, so the numbering depends only on the grouping. */
static int number_nodes(int n, const int *key, int *node, int *nnodes)
{
	struct keyed *k = malloc(sizeof(*k) * (size_t)n);
	int *group = malloc(sizeof(int) * (size_t)n);    /* rank -> group of equal keys */
	int *rename = malloc(sizeof(int) * (size_t)n);   /* group -> node */
	if (!k || !group || !rename) {
		free(k);
		free(group);
		free(rename);
		return rmoe_error(RMOE_ENOMEM, "out of host memory numbering nodes");
	}
	for (int r = 0; r < n; r++)
		k[r] = (struct keyed){key[r], r};
	qsort(k, (size_t)n, sizeof(*k), cmp_keyed);
	int groups = 0;
	for (int i = 0; i < n; i++) {
		if (i == 0 || k[i].key != k[i - 1].key)
			rename[groups++] = -1;
		group[k[i].rank] = groups - 1;
	}
	int next = 0;
	for (int r = 0; r < n; r++) {
		int g = group[r];
		if (rename[g] < 0)
			rename[g] = next++;
		node[r] = rename[g];
	}
	*nnodes = next;
	free(k);
	free(group);
	free(rename);
	return 0;
}

static int topology_alloc(struct rmoe_topology *t, int nranks)
{
	memset(t, 0, sizeof(*t));
	if (nranks < 1 || nranks > RMOE_CLUSTER_MAX_RANKS)
		return rmoe_error(RMOE_EINVAL, "%d ranks: expected 1 to %d", nranks, RMOE_CLUSTER_MAX_RANKS);
	t->nranks = nranks;
	t->node = malloc(sizeof(int) * (size_t)nranks);
	t->device = malloc(sizeof(int) * (size_t)nranks);
	if (!t->node || !t->device) {
		rmoe_topology_free(t);
		return rmoe_error(RMOE_ENOMEM, "out of host memory for the topology of %d ranks", nranks);
	}
	t->local.nvlink = -1;
	return 0;
}

/* Links and rates from the description, the defaults' for what it leaves out. */
static void apply_rates(struct rmoe_topology *t, const struct rmoe_cluster *c)
{
	struct rmoe_cluster d;
	rmoe_cluster_defaults(&d);
	if (!c)
		c = &d;
	for (int l = 0; l < RMOE_LINK_COUNT; l++)
		t->link[l] = c->link[l].bandwidth_gbs > 0 ? c->link[l] : d.link[l];
	t->bf16_tflops = c->bf16_tflops;
	t->f32_tflops = c->f32_tflops;
	t->memory_bytes = c->memory_bytes;
	snprintf(t->cluster, sizeof(t->cluster), "%s", c->name);
	t->gpu_link = c->gpu_link;
	t->gpu_link_known = 1;
	t->nics_per_node = c->nics_per_node;
}

/* Device of each rank: its index among its node's ranks (in rank order)
 * modulo the node's GPU count (gpus(r) <= 0: no device). */
static int place_devices(struct rmoe_topology *t, const int *gpus_of_rank, int gpus_all)
{
	int *seen = calloc((size_t)t->nnodes, sizeof(int));
	if (!seen)
		return rmoe_error(RMOE_ENOMEM, "out of host memory placing devices");
	for (int r = 0; r < t->nranks; r++) {
		int local = seen[t->node[r]]++;
		int g = gpus_of_rank ? gpus_of_rank[r] : gpus_all;
		t->device[r] = g > 0 ? local % g : -1;
	}
	free(seen);
	return 0;
}

/* The description's rank_nodes (and rank_devices). */
static int place_explicit(struct rmoe_topology *t, const struct rmoe_cluster *c)
{
	int rc = number_nodes(t->nranks, c->rank_nodes, t->node, &t->nnodes);
	if (rc)
		return rc;
	if (c->rank_devices) {
		memcpy(t->device, c->rank_devices, sizeof(int) * (size_t)t->nranks);
		return 0;
	}
	return place_devices(t, NULL, c->devices_per_node);
}

static int placement_mismatch(const struct rmoe_cluster *c, int nranks)
{
	return rmoe_error(RMOE_EINVAL,
	                  "cluster %s places %d ranks (rank_nodes) but there are %d: expected one entry per "
	                  "rank",
	                  c->name, c->nplaced, nranks);
}

struct named {
	const char *host;
	int rank;
};

static int cmp_named(const void *a, const void *b)
{
	const struct named *x = a, *y = b;
	int s = strncmp(x->host, y->host, RMOE_HOST_MAX);
	return s ? s : (x->rank > y->rank) - (x->rank < y->rank);
}

int rmoe_topology_from_ranks(const struct rmoe_rank_info *info, int nranks,
                             const struct rmoe_cluster *cluster, struct rmoe_topology *out)
{
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_topology_from_ranks: out is NULL");
	memset(out, 0, sizeof(*out));
	if (!info)
		return rmoe_error(RMOE_EINVAL, "rmoe_topology_from_ranks: info is NULL");
	if (cluster && cluster->nplaced && cluster->nplaced != nranks)
		return placement_mismatch(cluster, nranks);
	int rc = topology_alloc(out, nranks);
	if (rc)
		return rc;
	apply_rates(out, cluster);

	if (cluster && cluster->nplaced) {
		out->placement = "rank_nodes of the cluster description";
		rc = place_explicit(out, cluster);
	} else {
		out->placement = "MPI host names";
		/* Host names to integer keys (their rank in sorted order), then
		 * nodes by first appearance. */
		struct named *idx = malloc(sizeof(*idx) * (size_t)nranks);
		int *key = calloc((size_t)nranks, sizeof(int));
		int *gpus = calloc((size_t)nranks, sizeof(int));
		if (!idx || !key || !gpus)
			rc = rmoe_error(RMOE_ENOMEM, "out of host memory for the topology of %d ranks", nranks);
		if (!rc) {
			for (int r = 0; r < nranks; r++)
				idx[r] = (struct named){info[r].host, r};
			qsort(idx, (size_t)nranks, sizeof(*idx), cmp_named);
			for (int i = 0, k = 0; i < nranks; i++) {
				if (i > 0 && strncmp(idx[i].host, idx[i - 1].host, RMOE_HOST_MAX) != 0)
					k++;
				key[idx[i].rank] = k;
			}
			rc = number_nodes(nranks, key, out->node, &out->nnodes);
		}
		/* Kept to name a rank's host in messages (a peer that is lost). */
		if (!rc && !(out->hosts = malloc((size_t)nranks * RMOE_HOST_MAX)))
			rc = rmoe_error(RMOE_ENOMEM, "out of host memory for the host names of %d ranks", nranks);
		for (int r = 0; !rc && r < nranks; r++)
			snprintf(out->hosts + (size_t)r * RMOE_HOST_MAX, RMOE_HOST_MAX, "%.*s", RMOE_HOST_MAX - 1,
			         info[r].host);
		if (!rc) {
			for (int r = 0; r < nranks; r++)
				gpus[r] = cluster ? cluster->devices_per_node : info[r].gpus;
			rc = place_devices(out, gpus, 0);
		}
		if (!rc && !cluster) {
			/* NVLink only where every rank's hwloc saw it; unknown when
			 * any could not tell. */
			int all = 1, unknown = 0;
			for (int r = 0; r < nranks; r++) {
				all = all && info[r].nvlink == 1;
				unknown = unknown || info[r].nvlink < 0;
			}
			out->gpu_link = all ? RMOE_LINK_NVLINK : RMOE_LINK_PCIE;
			out->gpu_link_known = !unknown;
		}
		free(idx);
		free(key);
		free(gpus);
	}
	if (rc)
		rmoe_topology_free(out);
	return rc;
}

int rmoe_topology_simulated(const struct rmoe_cluster *cluster, const struct rmoe_local_hw *local,
                            int nranks, struct rmoe_topology *out)
{
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_topology_simulated: out is NULL");
	memset(out, 0, sizeof(*out));
	if (cluster && cluster->nplaced && cluster->nplaced != nranks)
		return placement_mismatch(cluster, nranks);
	if (cluster && !cluster->nplaced && (int64_t)cluster->nodes * cluster->ranks_per_node < nranks)
		return rmoe_error(RMOE_EINVAL,
		                  "%d ranks do not fit cluster %s: %d node(s) x %d ranks per node = %lld places",
		                  nranks, cluster->name, cluster->nodes, cluster->ranks_per_node,
		                  (long long)cluster->nodes * cluster->ranks_per_node);
	int rc = topology_alloc(out, nranks);
	if (rc)
		return rc;
	apply_rates(out, cluster);
	if (local)
		out->local = *local;
	if (cluster && cluster->nplaced) {
		out->placement = "rank_nodes of the cluster description";
		rc = place_explicit(out, cluster);
	} else if (cluster) {
		out->placement = "block: ranks_per_node consecutive ranks per node (simulated)";
		for (int r = 0; r < nranks; r++)
			out->node[r] = r / cluster->ranks_per_node;
		out->nnodes = (nranks + cluster->ranks_per_node - 1) / cluster->ranks_per_node;
		rc = place_devices(out, NULL, cluster->devices_per_node);
	} else {
		out->placement = "all ranks on this machine (simulated)";
		for (int r = 0; r < nranks; r++)
			out->node[r] = 0;
		out->nnodes = 1;
		int gpus = local ? local->gpus : 0;
		rc = place_devices(out, NULL, gpus);
		out->gpu_link = local && local->nvlink == 1 ? RMOE_LINK_NVLINK : RMOE_LINK_PCIE;
		out->gpu_link_known = local && local->nvlink >= 0;
	}
	if (rc)
		rmoe_topology_free(out);
	return rc;
}

enum rmoe_link_class rmoe_topology_link(const struct rmoe_topology *t, int a, int b)
{
	if (a == b)
		return RMOE_LINK_SAME_DEVICE;
	if (t->node[a] != t->node[b])
		return RMOE_LINK_NETWORK;
	if (t->device[a] >= 0 && t->device[b] >= 0)
		return t->device[a] == t->device[b] ? RMOE_LINK_SAME_DEVICE : t->gpu_link;
	return RMOE_LINK_SHM;
}

void rmoe_topology_free(struct rmoe_topology *t)
{
	if (!t)
		return;
	free(t->node);
	free(t->device);
	free(t->hosts);
	memset(t, 0, sizeof(*t));
}

const char *rmoe_topology_host(const struct rmoe_topology *t, int r)
{
	if (!t || !t->hosts || r < 0 || r >= t->nranks)
		return NULL;
	return t->hosts + (size_t)r * RMOE_HOST_MAX;
}
