/* The planner's topology and ring order: nodes numbered from gathered host
 * names or a description's placement, the ring over seeded random placements
 * (one crossing per node, the same order on every rank), and its edges' link
 * numbers, with network adapters shared on a node; the all-to-alls'
 * exchange order. No MPI initialisation, no
 * StarPU. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_main.h"
#include "rmoe_plan.h"
#include "planner_check.h"
#include "seeded.h"

static struct rmoe_rank_info *infos(int n, const char *const *hosts, int gpus)
{
	struct rmoe_rank_info *in = calloc((size_t)n, sizeof(*in));
	for (int r = 0; r < n; r++) {
		snprintf(in[r].host, sizeof(in[r].host), "%s", hosts[r]);
		in[r].gpus = gpus;
		in[r].nvlink = -1;
	}
	return in;
}

/* key[r] = the node of rank r: [0..nodes) repeated, shuffled by the
 * seeded stream (Fisher-Yates); the caller frees it. */
static int *shuffled_nodes(int n, int nodes, uint64_t stream)
{
	int *key = malloc(sizeof(int) * (size_t)n);
	for (int r = 0; r < n; r++)
		key[r] = r % nodes;
	for (int r = n - 1; r > 0; r--) {
		int j = (int)(rmoe_seeded_u64(SEED, stream, (uint64_t)r) % (uint64_t)(r + 1));
		int tmp = key[r];
		key[r] = key[j];
		key[j] = tmp;
	}
	return key;
}

static void test_planner_topology_numbers_nodes_by_first_appearance(void **state)
{
	(void)state;
	const char *hosts[] = {"zeta", "alpha", "zeta", "mid", "alpha", "zeta"};
	struct rmoe_rank_info *in = infos(6, hosts, 2);
	struct rmoe_topology t;
	assert_int_equal(rmoe_topology_from_ranks(in, 6, NULL, &t), 0);
	assert_int_equal(t.nnodes, 3);
	const int node[] = {0, 1, 0, 2, 1, 0}, device[] = {0, 0, 1, 0, 1, 0};
	for (int r = 0; r < 6; r++) {
		assert_int_equal(t.node[r], node[r]);
		assert_int_equal(t.device[r], device[r]);
	}
	/* hwloc could not tell NVLink: PCIe assumed and said so. */
	assert_int_equal(t.gpu_link, RMOE_LINK_PCIE);
	assert_int_equal(t.gpu_link_known, 0);
	assert_int_equal(rmoe_topology_link(&t, 0, 5), RMOE_LINK_SAME_DEVICE);
	assert_int_equal(rmoe_topology_link(&t, 0, 2), RMOE_LINK_PCIE);
	assert_int_equal(rmoe_topology_link(&t, 0, 1), RMOE_LINK_NETWORK);
	rmoe_topology_free(&t);

	for (int r = 0; r < 6; r++) {
		in[r].gpus = 0;
		in[r].nvlink = 0;
	}
	assert_int_equal(rmoe_topology_from_ranks(in, 6, NULL, &t), 0);
	assert_int_equal(t.device[2], -1);
	assert_int_equal(rmoe_topology_link(&t, 0, 2), RMOE_LINK_SHM);
	assert_int_equal(rmoe_topology_link(&t, 3, 3), RMOE_LINK_SAME_DEVICE);
	rmoe_topology_free(&t);

	/* A description's placement wins over the hosts, and must count the ranks. */
	struct rmoe_cluster c;
	char *s = variant(NULL, "[link same_device]\nbandwidth_gbs = 900\nlatency_us = 4\n"
	                        "[placement]\nrank_nodes = 1 1 0 0 1 0\n");
	s[strstr(s, "ranks_per_node = 2") - s + 17] = '3';
	assert_int_equal(parse_str(s, &c), 0);
	assert_int_equal(rmoe_topology_from_ranks(in, 6, &c, &t), 0);
	assert_int_equal(t.node[0], 0);
	assert_int_equal(t.node[2], 1);
	assert_int_equal(t.device[5], 0);   /* third rank of its node, mod 2 devices */
	assert_true(t.link[RMOE_LINK_NETWORK].bandwidth_gbs == 25.0);
	rmoe_topology_free(&t);
	assert_int_equal(rmoe_topology_from_ranks(in, 5, &c, &t), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_strerror(RMOE_EINVAL), "places 6 ranks"));
	rmoe_cluster_free(&c);
	free(s);
	free(in);
}

static int count_crossings(const int *node, const int *order, int n)
{
	int c = 0;
	for (int i = 0; i < n && n > 1; i++)
		c += node[order[i]] != node[order[(i + 1) % n]];
	return c;
}

/* Seeded placements on 2, 4 and 8 simulated nodes of several ranks each,
 * ranks shuffled over the nodes. */
static void test_planner_ring_crosses_nodes_once_per_node(void **state)
{
	(void)state;
	const int node_counts[] = {2, 4, 8};
	for (int ni = 0; ni < 3; ni++)
		for (int per = 2; per <= 4; per++)
			for (uint64_t trial = 0; trial < 20; trial++) {
				int nodes = node_counts[ni], n = nodes * per;
				uint64_t stream = 1000 * (uint64_t)nodes + 100 * (uint64_t)per + trial;
				/* Node keys: a seeded shuffle of [0..nodes) x per, node
				 * numbers themselves permuted. */
				int *key = shuffled_nodes(n, nodes, stream);
				const char *names[] = {"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"};
				const char **hosts = malloc(sizeof(char *) * (size_t)n);
				for (int r = 0; r < n; r++)
					hosts[r] = names[(key[r] * 5 + (int)trial) % nodes];
				struct rmoe_rank_info *in = infos(n, hosts, per > 2 ? 2 : 0);

				struct rmoe_topology t;
				assert_int_equal(rmoe_topology_from_ranks(in, n, NULL, &t), 0);
				assert_int_equal(t.nnodes, nodes);
				int *order = malloc(sizeof(int) * (size_t)n), *again = malloc(sizeof(int) * (size_t)n);
				int *seen = calloc((size_t)n, sizeof(int));
				assert_int_equal(rmoe_ring_order(&t, order), 0);
				for (int i = 0; i < n; i++) {
					assert_true(order[i] >= 0 && order[i] < n);
					assert_int_equal(seen[order[i]]++, 0);
				}
				assert_int_equal(count_crossings(t.node, order, n), nodes);
				assert_int_equal(rmoe_ring_node_crossings(&t, order), nodes);
				/* Each node's ranks are contiguous: every crossing enters a
				 * node not visited before. */
				for (int i = 1; i < n; i++)
					if (t.node[order[i]] != t.node[order[i - 1]])
						for (int j = 0; j < i; j++)
							assert_int_not_equal(t.node[order[j]], t.node[order[i]]);

				/* Same input, same order; and every rank computes from its
				 * own copy of the gathered data, with the same result. */
				assert_int_equal(rmoe_ring_order(&t, again), 0);
				assert_memory_equal(order, again, sizeof(int) * (size_t)n);
				for (int rank = 0; rank < n; rank++) {
					struct rmoe_rank_info *copy = malloc(sizeof(*copy) * (size_t)n);
					memcpy(copy, in, sizeof(*copy) * (size_t)n);
					struct rmoe_topology tr;
					assert_int_equal(rmoe_topology_from_ranks(copy, n, NULL, &tr), 0);
					assert_int_equal(rmoe_ring_order(&tr, again), 0);
					assert_memory_equal(order, again, sizeof(int) * (size_t)n);
					rmoe_topology_free(&tr);
					free(copy);
				}

				/* The same grouping given as a description's rank_nodes (node
				 * numbers of another naming) plans the same ring. */
				struct rmoe_cluster c;
				rmoe_cluster_defaults(&c);
				c.nodes = nodes;
				c.ranks_per_node = per;
				c.devices_per_node = per > 2 ? 2 : 0;
				c.nplaced = n;
				c.rank_nodes = key;
				struct rmoe_topology ts;
				assert_int_equal(rmoe_topology_simulated(&c, NULL, n, &ts), 0);
				assert_memory_equal(ts.node, t.node, sizeof(int) * (size_t)n);
				assert_int_equal(rmoe_ring_order(&ts, again), 0);
				assert_memory_equal(order, again, sizeof(int) * (size_t)n);

				struct rmoe_ring_edge *edges = malloc(sizeof(*edges) * (size_t)n);
				assert_int_equal(rmoe_ring_edges(&t, order, edges), 0);
				int network = 0;
				for (int i = 0; i < n; i++)
					network += edges[i].link == RMOE_LINK_NETWORK;
				assert_int_equal(network, nodes);

				free(edges);
				rmoe_topology_free(&ts);
				rmoe_topology_free(&t);
				free(order);
				free(again);
				free(seen);
				free(in);
				free(hosts);
				free(key);
			}
}

static void test_planner_ring_edges_carry_link_numbers(void **state)
{
	(void)state;
	struct rmoe_cluster c;
	char *s = variant(NULL, "[link same_device]\nbandwidth_gbs = 900\nlatency_us = 4\n");
	s[strstr(s, "ranks_per_node = 2") - s + 17] = '4';
	assert_int_equal(parse_str(s, &c), 0);
	struct rmoe_topology t;
	assert_int_equal(rmoe_topology_simulated(&c, NULL, 8, &t), 0);
	assert_int_equal(t.nnodes, 2);
	int order[8];
	struct rmoe_ring_edge e[8];
	assert_int_equal(rmoe_ring_order(&t, order), 0);
	/* Block placement, device = index on node mod 2: ranks 0 and 2 share a
	 * device and are neighbours. */
	const int expect[8] = {0, 2, 1, 3, 4, 6, 5, 7};
	assert_memory_equal(order, expect, sizeof(expect));
	assert_int_equal(rmoe_ring_edges(&t, order, e), 0);
	const enum rmoe_link_class links[8] = {RMOE_LINK_SAME_DEVICE, RMOE_LINK_PCIE, RMOE_LINK_SAME_DEVICE,
	                                       RMOE_LINK_NETWORK, RMOE_LINK_SAME_DEVICE, RMOE_LINK_PCIE,
	                                       RMOE_LINK_SAME_DEVICE, RMOE_LINK_NETWORK};
	for (int i = 0; i < 8; i++)
		assert_int_equal(e[i].link, links[i]);
	assert_true(e[0].bandwidth_gbs == 900.0 && e[0].latency_us == 4.0);
	assert_true(e[3].bandwidth_gbs == 25.0 && e[3].latency_us == 2.0);
	/* The slowest edge for a large message is the network; 1 MB takes
	 * 2 us + 1e6 / 25e9 s there. */
	int slow = rmoe_ring_slowest_edge(e, 8, 1e6);
	assert_int_equal(e[slow].link, RMOE_LINK_NETWORK);
	assert_true(fabs(rmoe_edge_seconds(&e[slow], 1e6) - (2e-6 + 1e6 / 25e9)) < 1e-15);
	int bad[8] = {0, 1, 2, 3, 4, 5, 6, 6};
	assert_int_equal(rmoe_ring_edges(&t, bad, e), RMOE_EINVAL);
	rmoe_topology_free(&t);

	/* More ranks than the description's nodes hold. */
	assert_int_equal(rmoe_topology_simulated(&c, NULL, 17, &t), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_strerror(RMOE_EINVAL), "do not fit"));
	rmoe_cluster_free(&c);
	free(s);
}

/* Ranks dealt round-robin over 4 CPU-only hosts with one network adapter
 * each (the emulated hosts of scripts/cluster/): the planned ring crosses
 * once per host and every network edge has an adapter to itself; the ring
 * in rank order crosses on every edge, two per host, each at half the
 * bandwidth, so its hop takes twice as long. Host names are kept. */
static void test_planner_ring_edges_share_a_node_adapter(void **state)
{
	(void)state;
	const char *text = "name = emulated\nnodes = 4\ndevices_per_node = 0\nranks_per_node = 2\n"
	                   "nics_per_node = 1\n[device]\nbf16_tflops = 0.01\nf32_tflops = 0.01\n"
	                   "memory = 2G\n[link shm]\nbandwidth_gbs = 2\nlatency_us = 5\n"
	                   "[link network]\nbandwidth_gbs = 0.125\nlatency_us = 0\n";
	struct rmoe_cluster c;
	assert_int_equal(parse_str(text, &c), 0);
	assert_int_equal(c.nics_per_node, 1);
	const char *hosts[] = {"h0", "h1", "h2", "h3", "h0", "h1", "h2", "h3"};
	struct rmoe_rank_info *in = infos(8, hosts, 0);
	struct rmoe_topology t;
	assert_int_equal(rmoe_topology_from_ranks(in, 8, &c, &t), 0);
	assert_string_equal(rmoe_topology_host(&t, 5), "h1");
	assert_null(rmoe_topology_host(&t, 8));

	struct rmoe_plan_request req = {0};
	struct rmoe_plan planned, ranked;
	assert_int_equal(rmoe_plan_make(&req, &t, &planned), 0);
	const int expect[8] = {0, 4, 1, 5, 2, 6, 3, 7};
	assert_memory_equal(planned.order, expect, sizeof(expect));
	assert_int_equal(planned.node_crossings, 4);
	req.rank_order = 1;
	assert_int_equal(rmoe_plan_make(&req, &t, &ranked), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(ranked.order[i], i);
	assert_int_equal(ranked.node_crossings, 8);
	for (int i = 0; i < 8; i++) {
		const struct rmoe_ring_edge *p = &planned.edges[i], *r = &ranked.edges[i];
		assert_int_equal(p->link, i % 2 ? RMOE_LINK_NETWORK : RMOE_LINK_SHM);
		assert_int_equal(p->sharing, i % 2 ? 1 : 0);
		assert_true(p->bandwidth_gbs == (i % 2 ? 0.125 : 2.0));
		assert_int_equal(r->link, RMOE_LINK_NETWORK);
		assert_int_equal(r->sharing, 2);
		assert_true(r->bandwidth_gbs == 0.0625);
	}
	double bytes = 3e6;
	int sp = rmoe_ring_slowest_edge(planned.edges, 8, bytes), sr = rmoe_ring_slowest_edge(ranked.edges, 8, bytes);
	assert_true(fabs(rmoe_edge_seconds(&ranked.edges[sr], bytes) / rmoe_edge_seconds(&planned.edges[sp], bytes) -
	                 2.0) < 1e-12);
	rmoe_plan_free(&planned);
	rmoe_plan_free(&ranked);
	rmoe_topology_free(&t);

	/* Without nics_per_node every edge has an adapter of its own: the
	 * description's bandwidth, as before. */
	c.nics_per_node = 0;
	assert_int_equal(rmoe_topology_from_ranks(in, 8, &c, &t), 0);
	assert_int_equal(rmoe_plan_make(&req, &t, &ranked), 0);
	assert_true(ranked.edges[0].bandwidth_gbs == 0.125 && ranked.edges[0].sharing == 0);
	rmoe_plan_free(&ranked);
	rmoe_topology_free(&t);
	rmoe_cluster_free(&c);
	free(in);
}

/* The all-to-alls' exchange order (scheduler/exchange_order.c) over seeded
 * random placements: for every rank step 0 is its own block and its steps
 * visit every rank once; at every step the ranks' targets are a
 * permutation whose sources invert it (no rank receives two blocks of a
 * step). On nodes of equal size a node's own steps come first and in each
 * later step every rank of a node sends to a different rank of one other
 * node (each adapter one block each way); on unequal nodes, pairwise. */
static void check_exchange_order(const struct rmoe_topology *t, int equal)
{
	const int n = t->nranks, per = n / t->nnodes;
	int *to = malloc(sizeof(int) * (size_t)(n * n)), *from = malloc(sizeof(int) * (size_t)(n * n));
	int *seen = malloc(sizeof(int) * (size_t)n);
	for (int me = 0; me < n; me++) {
		assert_int_equal(rmoe_exchange_order(t, me, to + me * n, from + me * n), 0);
		assert_int_equal(to[me * n], me);
		assert_int_equal(from[me * n], me);
		memset(seen, 0, sizeof(int) * (size_t)n);
		for (int k = 0; k < n; k++)
			assert_int_equal(seen[to[me * n + k]]++, 0);
	}
	for (int k = 0; k < n; k++) {
		memset(seen, 0, sizeof(int) * (size_t)n);
		for (int r = 0; r < n; r++) {
			const int q = to[r * n + k];
			assert_int_equal(seen[q]++, 0);
			assert_int_equal(from[q * n + k], r);
			if (!equal)
				assert_int_equal(q, (r + k) % n);
			else if (k < per)
				assert_int_equal(t->node[q], t->node[r]);
			else
				assert_int_not_equal(t->node[q], t->node[r]);
		}
		/* Equal nodes: a step takes all of a node's ranks to one node. */
		for (int r = 0; equal && r < n; r++)
			for (int r2 = 0; r2 < n; r2++)
				if (t->node[r] == t->node[r2])
					assert_int_equal(t->node[to[r * n + k]], t->node[to[r2 * n + k]]);
	}
	free(to);
	free(from);
	free(seen);
}

static void test_planner_exchange_order_is_a_matching_per_step(void **state)
{
	(void)state;
	const char *names[] = {"n0", "n1", "n2", "n3"};
	for (int nodes = 1; nodes <= 4; nodes++)
		for (int per = 1; per <= 4; per++)
			for (uint64_t trial = 0; trial < 5; trial++) {
				const int n = nodes * per;
				/* Hosts interleaved by a seeded shuffle: a node's ranks
				 * need not be consecutive. */
				int *key = shuffled_nodes(n, nodes, 7000 + 100 * (uint64_t)n + trial);
				const char **hosts = malloc(sizeof(char *) * (size_t)n);
				for (int r = 0; r < n; r++)
					hosts[r] = names[key[r]];
				struct rmoe_rank_info *in = infos(n, hosts, 0);
				struct rmoe_topology t;
				assert_int_equal(rmoe_topology_from_ranks(in, n, NULL, &t), 0);
				check_exchange_order(&t, nodes > 1);
				rmoe_topology_free(&t);
				free(in);
				free(hosts);
				free(key);
			}
	/* Nodes of 3 and 1 ranks: the pairwise order. */
	const char *uneven[] = {"a", "a", "b", "a"};
	struct rmoe_rank_info *in = infos(4, uneven, 0);
	struct rmoe_topology t;
	assert_int_equal(rmoe_topology_from_ranks(in, 4, NULL, &t), 0);
	check_exchange_order(&t, 0);
	rmoe_topology_free(&t);
	free(in);
	struct rmoe_topology none = {0};
	int to[1], from[1];
	assert_int_equal(rmoe_exchange_order(&none, 0, to, from), RMOE_EINVAL);
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_planner_topology_numbers_nodes_by_first_appearance),
               cmocka_unit_test(test_planner_ring_crosses_nodes_once_per_node),
               cmocka_unit_test(test_planner_ring_edges_carry_link_numbers),
               cmocka_unit_test(test_planner_ring_edges_share_a_node_adapter),
               cmocka_unit_test(test_planner_exchange_order_is_a_matching_per_step))
