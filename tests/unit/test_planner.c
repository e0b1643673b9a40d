/* The planner's pure parts: cluster descriptions (good ones, the shipped
 * ones, and each way one can be wrong, with the line named), topology from
 * gathered host names, the ring order over seeded random placements, the
 * Table 2 volumes by hand, and the routing choice against the paper's trend
 * and its crossover. No MPI initialisation, no StarPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_plan.h"
#include "seeded.h"

#define SEED 11u

/* A small valid description; tests append or substitute lines. */
static const char *const small =
	"# two nodes of two GPUs\n"
	"name = small\n"
	"nodes = 2\n"
	"devices_per_node = 2\n"
	"ranks_per_node = 2\n"
	"gpu_link = pcie\n"
	"[device]\n"
	"bf16_tflops = 100\n"
	"f32_tflops = 10\n"
	"memory = 16G\n"
	"[link pcie]\n"
	"bandwidth_gbs = 50\n"
	"latency_us = 3\n"
	"[link network]\n"
	"bandwidth_gbs = 25\n"
	"latency_us = 2\n";

static int parse_str(const char *text, struct rmoe_cluster *c)
{
	return rmoe_cluster_parse(text, strlen(text), c);
}

/* ---- cluster descriptions --------------------------------------------------- */

static void test_planner_parses_good_descriptions(void **state)
{
	(void)state;
	struct rmoe_cluster c;
	assert_int_equal(parse_str(small, &c), 0);
	assert_string_equal(c.name, "small");
	assert_int_equal(c.nodes, 2);
	assert_int_equal(c.devices_per_node, 2);
	assert_int_equal(c.gpu_link, RMOE_LINK_PCIE);
	assert_true(c.link[RMOE_LINK_NETWORK].bandwidth_gbs == 25.0);
	assert_true(c.link[RMOE_LINK_PCIE].latency_us == 3.0);
	assert_true(c.bf16_tflops == 100.0);
	assert_int_equal(c.memory_bytes, 16LL << 30);
	assert_int_equal(c.nplaced, 0);
	rmoe_cluster_free(&c);

	/* CRLF, tabs, trailing comments, no final newline, a repeated section
	 * header, an explicit placement, and other spellings of bytes. */
	const char *text =
		"name=crlf-1\r\n"
		"nodes\t=\t4   # four\r\n"
		"devices_per_node = 0\r\n"
		"ranks_per_node = 3\r\n"
		"[ device ]\r\n"
		"bf16_tflops = 1.5e0\r\n"
		"[link shm]\r\n"
		"bandwidth_gbs = 10\r\n"
		"[device]\r\n"
		"f32_tflops = 0.5\r\n"
		"memory = 68719476736\r\n"
		"[link shm]\r\n"
		"latency_us = 0\r\n"
		"[link network]\nbandwidth_gbs = 12.5\nlatency_us = 1.5\n"
		"[placement]\n"
		"rank_nodes = 3 1 3  1 0\n"
		"#trailing comment without newline";
	assert_int_equal(parse_str(text, &c), 0);
	assert_string_equal(c.name, "crlf-1");
	assert_int_equal(c.nodes, 4);
	assert_int_equal(c.ranks_per_node, 3);
	assert_int_equal(c.memory_bytes, 64LL << 30);
	assert_true(c.link[RMOE_LINK_SHM].latency_us == 0.0);
	assert_int_equal(c.nplaced, 5);
	assert_int_equal(c.rank_nodes[0], 3);
	assert_int_equal(c.rank_nodes[4], 0);
	assert_null(c.rank_devices);
	rmoe_cluster_free(&c);

	char buf[1024];
	snprintf(buf, sizeof(buf), "%s[placement]\nrank_nodes = 1 0 1\nrank_devices = 1 1 0\n", small);
	assert_int_equal(parse_str(buf, &c), 0);
	assert_int_equal(c.nplaced, 3);
	assert_int_equal(c.rank_devices[0], 1);
	assert_int_equal(c.rank_devices[2], 0);
	rmoe_cluster_free(&c);

	const char *sizes[] = {"64G", "64GiB", "65536M", "67108864K", "68719476736"};
	for (unsigned i = 0; i < 5; i++) {
		char *s = malloc(strlen(small) + 32);
		const char *at = strstr(small, "memory = 16G");
		snprintf(s, strlen(small) + 32, "%.*smemory = %s%s", (int)(at - small), small, sizes[i],
		         at + strlen("memory = 16G"));
		assert_int_equal(parse_str(s, &c), 0);
		assert_int_equal(c.memory_bytes, 64LL << 30);
		rmoe_cluster_free(&c);
		free(s);
	}
}

static void test_planner_loads_shipped_clusters(void **state)
{
	(void)state;
	struct rmoe_cluster c;
	int rc = rmoe_cluster_load(RMOE_SOURCE_DIR "/scheduler/clusters/mn5-acc.cluster", &c);
	if (rc)
		fail_msg("%s", rmoe_strerror(rc));
	assert_string_equal(c.name, "mn5-acc");
	assert_int_equal(c.devices_per_node, 4);
	assert_int_equal(c.ranks_per_node, 4);
	assert_int_equal(c.gpu_link, RMOE_LINK_NVLINK);
	assert_int_equal(c.memory_bytes, 64LL << 30);
	assert_true(c.link[RMOE_LINK_NVLINK].bandwidth_gbs > 5 * c.link[RMOE_LINK_NETWORK].bandwidth_gbs);
	rmoe_cluster_free(&c);

	rc = rmoe_cluster_load(RMOE_SOURCE_DIR "/scheduler/clusters/dgx-h100.cluster", &c);
	if (rc)
		fail_msg("%s", rmoe_strerror(rc));
	assert_string_equal(c.name, "dgx-h100");
	assert_int_equal(c.nodes, 1);
	assert_int_equal(c.devices_per_node, 8);
	assert_int_equal(c.memory_bytes, 80LL << 30);
	rmoe_cluster_free(&c);

	rc = rmoe_cluster_load("/nonexistent/x.cluster", &c);
	assert_int_equal(rc, RMOE_EIO);
	assert_non_null(strstr(rmoe_strerror(rc), "/nonexistent/x.cluster"));
}

/* small with one line replaced (by its key) or, with no key, text appended. */
static char *variant(const char *key_line, const char *replacement)
{
	size_t n = strlen(small) + strlen(replacement) + 8;
	char *s = malloc(n);
	const char *at = key_line ? strstr(small, key_line) : NULL;
	if (at) {
		const char *eol = strchr(at, '\n');
		snprintf(s, n, "%.*s%s%s", (int)(at - small), small, replacement, eol);
	} else {
		snprintf(s, n, "%s%s", small, replacement);
	}
	return s;
}

static void expect_bad(const char *text, size_t len, const char *needle1, const char *needle2)
{
	struct rmoe_cluster c;
	int rc = rmoe_cluster_parse(text, len, &c);
	if (rc != RMOE_EFORMAT)
		fail_msg("expected RMOE_EFORMAT for <<%.*s>>, got %d", (int)len, text, rc);
	const char *msg = rmoe_strerror(rc);
	if (!strstr(msg, needle1) || (needle2 && !strstr(msg, needle2)))
		fail_msg("message '%s' does not mention '%s'%s%s", msg, needle1, needle2 ? " and " : "",
		         needle2 ? needle2 : "");
	assert_null(c.rank_nodes);
	assert_null(c.rank_devices);
}

static void expect_bad_variant(const char *key_line, const char *replacement, const char *needle1,
                               const char *needle2)
{
	char *s = variant(key_line, replacement);
	expect_bad(s, strlen(s), needle1, needle2);
	free(s);
}

static void test_planner_rejects_bad_descriptions_naming_the_line(void **state)
{
	(void)state;
	/* Lines of small: 2 name, 3 nodes, 4 devices_per_node, 5 ranks_per_node,
	 * 6 gpu_link, 7 [device], 8 bf16, 9 f32, 10 memory, 11 [link pcie],
	 * 12-13 its values, 14 [link network], 15-16 its values; appended text
	 * starts on line 17. */
	expect_bad_variant("nodes = 2", "nodes = two", "line 3", "nodes 'two'");
	expect_bad_variant("nodes = 2", "nodes = 0", "line 3", "from 1");
	expect_bad_variant("nodes = 2", "nodes = 99999999999999999999999", "line 3", "nodes");
	expect_bad_variant("nodes = 2", "nodes = -2", "line 3", "nodes");
	expect_bad_variant("nodes = 2", "nodes 2", "line 3", "'key = value'");
	expect_bad_variant("nodes = 2", "= 2", "line 3", "a key before");
	expect_bad_variant("nodes = 2", "nodes =", "line 3", "a value");
	expect_bad_variant("nodes = 2", "nodez = 2", "line 3", "key 'nodez'");
	expect_bad_variant("name = small", "name = has space", "line 2", "name");
	expect_bad_variant("name = small", "name = \"quoted\"", "line 2", "name");
	expect_bad_variant("gpu_link = pcie", "gpu_link = infiniband", "line 6", "nvlink or pcie");
	expect_bad_variant("bf16_tflops = 100", "bf16_tflops = nan", "line 8", "bf16_tflops");
	expect_bad_variant("bf16_tflops = 100", "bf16_tflops = inf", "line 8", "bf16_tflops");
	expect_bad_variant("bf16_tflops = 100", "bf16_tflops = 0", "line 8", "positive");
	expect_bad_variant("memory = 16G", "memory = 16Q", "line 10", "memory '16Q'");
	expect_bad_variant("memory = 16G", "memory = 0.5", "line 10", "memory");
	expect_bad_variant("memory = 16G", "memory = GiB", "line 10", "memory");
	expect_bad_variant("bandwidth_gbs = 50", "bandwidth_gbs = -50", "line 12", "bandwidth_gbs");
	expect_bad_variant("latency_us = 3", "latency_us = 1e9", "line 13", "latency_us");
	expect_bad_variant("[link pcie]", "[link infiniband]", "line 11", "same_device, nvlink");
	expect_bad_variant("[link pcie]", "[links]", "line 11", "section");
	expect_bad_variant("[link pcie]", "[link pcie", "line 11", "section header");
	expect_bad_variant("[device]", "[node]", "line 7", "section");
	/* A key of another section. */
	expect_bad_variant(NULL, "nodes = 3\n", "line 17", "in [link]");
	expect_bad_variant(NULL, "[device]\nlatency_us = 1\n", "line 18", "in [device]");
	/* Set twice. */
	expect_bad_variant(NULL, "[device]\nmemory = 8G\n", "line 18", "already set on line 10");
	expect_bad_variant(NULL, "[link network]\nlatency_us = 9\n", "line 18", "already set on line 16");
	/* Missing pieces, reported at the end of input. */
	expect_bad_variant("nodes = 2", "# no nodes", "end of input", "'nodes' is missing");
	expect_bad_variant("memory = 16G", "", "end of input", "'memory' is missing");
	expect_bad_variant("gpu_link = pcie", "", "end of input", "gpu_link");
	expect_bad_variant("[link network]", "[link shm]", "end of input", "[link network]");
	expect_bad_variant("ranks_per_node = 2", "ranks_per_node = 3", "end of input", "[link same_device]");
	expect_bad_variant("latency_us = 3", "", "line 12", "no latency_us");
	/* Placements that contradict the machine. */
	expect_bad_variant(NULL, "[placement]\nrank_nodes = 0 1 2\n", "line 18", "node 2");
	expect_bad_variant(NULL, "[placement]\nrank_nodes = 0 1 x\n", "line 18", "entry 2 of rank_nodes");
	expect_bad_variant(NULL, "[placement]\nrank_nodes = 0 0 0 1\n", "line 18", "more than ranks_per_node");
	expect_bad_variant(NULL, "[placement]\nrank_nodes = 0 1\nrank_devices = 0\n", "line 19", "lists 1");
	expect_bad_variant(NULL, "[placement]\nrank_nodes = 0 1\nrank_devices = 0 2\n", "line 19", "device 2");
	expect_bad_variant(NULL, "[placement]\nrank_devices = 0 1\n", "line 18", "needs rank_nodes");
	/* Bytes no text has. */
	char nul[64] = "name = a\nnodes = 1\0junk\n";
	expect_bad(nul, 25, "line 2", "NUL");
	expect_bad("\xff\xfe=\x01\n", 5, "line 1", "key '?\?'");
}

/* Random damage to a good description: the parser answers 0 or
 * RMOE_EFORMAT, never reads out of bounds (run under RMOE_SANITIZE). */
static void test_planner_parser_survives_damaged_input(void **state)
{
	(void)state;
	char *good = variant(NULL, "[placement]\nrank_nodes = 1 0 1 0\nrank_devices = 0 1 1 0\n");
	size_t n = strlen(good);
	char *buf = malloc(n);
	int ok = 0, bad = 0;
	for (uint64_t trial = 0; trial < 4000; trial++) {
		memcpy(buf, good, n);
		size_t len = n;
		int edits = 1 + (int)(rmoe_seeded_u64(SEED, trial, 0) % 4);
		for (int e = 0; e < edits; e++) {
			uint64_t r = rmoe_seeded_u64(SEED, trial, (uint64_t)e + 1);
			size_t at = (size_t)(r % len);
			switch ((r >> 32) % 4) {
			case 0: buf[at] = (char)(r >> 40); break;                 /* any byte */
			case 1: buf[at] = "=#[]\n \r0-9.eG"[(r >> 40) % 14]; break;  /* syntax */
			case 2: len = at + 1; break;                             /* truncate */
			default: memset(buf + at, '9', len - at < 24 ? len - at : 24); break;
			}
		}
		struct rmoe_cluster c;
		int rc = rmoe_cluster_parse(buf, len, &c);
		assert_true(rc == 0 || rc == RMOE_EFORMAT);
		if (rc == 0)
			ok++;
		else
			bad++;
		rmoe_cluster_free(&c);
	}
	assert_true(ok > 0 && bad > 0);
	free(buf);
	free(good);
	struct rmoe_cluster c;
	assert_int_equal(rmoe_cluster_parse("", 0, &c), RMOE_EFORMAT);
	assert_int_equal(rmoe_cluster_parse(NULL, 0, &c), RMOE_EFORMAT);
}

/* ---- topology and ring order -------------------------------------------------- */

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
				int *key = malloc(sizeof(int) * (size_t)n);
				for (int r = 0; r < n; r++)
					key[r] = r % nodes;
				for (int r = n - 1; r > 0; r--) {
					int j = (int)(rmoe_seeded_u64(SEED, stream, (uint64_t)r) % (uint64_t)(r + 1));
					int tmp = key[r];
					key[r] = key[j];
					key[j] = tmp;
				}
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

/* ---- Table 2 and the routing choice ----------------------------------------------- */

/* The ring of mn5-acc with EP ranks placed four per node. */
static struct rmoe_ring_edge *mn5_ring(int ep, struct rmoe_topology *t, double *tflops)
{
	struct rmoe_cluster c;
	int rc = rmoe_cluster_load(RMOE_SOURCE_DIR "/scheduler/clusters/mn5-acc.cluster", &c);
	if (rc)
		fail_msg("%s", rmoe_strerror(rc));
	assert_int_equal(rmoe_topology_simulated(&c, NULL, ep, t), 0);
	rmoe_cluster_free(&c);
	int *order = malloc(sizeof(int) * (size_t)ep);
	struct rmoe_ring_edge *e = malloc(sizeof(*e) * (size_t)ep);
	assert_int_equal(rmoe_ring_order(t, order), 0);
	assert_int_equal(rmoe_ring_edges(t, order, e), 0);
	free(order);
	*tflops = t->bf16_tflops;
	return e;
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

static void test_planner_table2_volumes_by_hand(void **state)
{
	(void)state;
	/* Qwen3-30B-A3B's layer at the paper's §2 profile (B=24, S=16384,
	 * SP=2, CP=4: 49152 tokens per rank), EP=8, ETP=2, bf16. */
	struct rmoe_routing_problem p = {.hidden = 2048, .ffn = 768, .experts = 128, .topk = 8,
	                                 .tokens = 24 * 16384 / (2 * 4), .ep = 8, .etp = 2,
	                                 .dtype = RMOE_DTYPE_BF16};
	assert_int_equal(rmoe_routing_check(&p), 0);
	assert_int_equal(rmoe_routing_metadata_bytes(8), 64);
	/* E/EP = 16 experts of 3 x 2048 x (768/2) bf16 values. */
	assert_true(rmoe_expert_hop_bytes(&p, 0) == 16.0 * 3 * 2048 * 384 * 2);
	assert_true(rmoe_expert_hop_bytes(&p, 0) == 75497472.0);
	assert_true(rmoe_expert_hop_bytes(&p, 1) == 150994944.0);
	/* 49152 tokens of 2048 x 2 bytes + 8 x (4 + 4) bytes of metadata. */
	assert_true(rmoe_token_hop_bytes(&p, 0) == 49152.0 * 4160);
	assert_true(rmoe_token_hop_bytes(&p, 0) == 204472320.0);
	assert_true(rmoe_token_hop_bytes(&p, 1) == 408944640.0);
	/* 49152 x 8 / 8 pairs of 2 x 3 x 2048 x 384 flops; backward 3x. */
	assert_true(rmoe_hop_flops(&p, 0) == 49152.0 * 4718592);
	assert_true(rmoe_hop_flops(&p, 1) == 3 * 49152.0 * 4718592);
	/* Carried by the implementation: the output accumulator too (2048 x 2
	 * bytes more per token); backward x, dy, dx and order, weights, dg. */
	assert_true(rmoe_token_hop_bytes_carried(&p, 0) == 49152.0 * 8256);
	assert_true(rmoe_token_hop_bytes_carried(&p, 1) == 49152.0 * (3 * 4096 + 96));
	/* Forward and backward together: token routing below 3 x 75497472 /
	 * (5 x 4096 + 160) = 10973.5 tokens. */
	assert_int_equal(rmoe_routing_crossover_tokens(&p), 10974);

	struct rmoe_topology t;
	double tflops;
	struct rmoe_ring_edge *e = mn5_ring(8, &t, &tflops);
	struct rmoe_routing_choice ch;
	assert_int_equal(rmoe_routing_choose(&p, e, 8, tflops, &ch), 0);
	/* Slowest edge: the network, 24 GB/s and 2 us in mn5-acc.cluster. */
	double transfer = 2e-6 + 75497472.0 / 24e9, compute = 49152.0 * 4718592 / 400e12;
	assert_int_equal(e[ch.expert[0].slowest_edge].link, RMOE_LINK_NETWORK);
	assert_true(fabs(ch.expert[0].transfer_s - transfer) < 1e-12);
	assert_true(fabs(ch.expert[0].compute_s - compute) < 1e-12);
	assert_true(fabs(ch.expert[0].exposed_s - (transfer - compute)) < 1e-12);
	assert_true(fabs(ch.expert[0].hidden_fraction - compute / transfer) < 1e-12);
	assert_true(ch.pairs_per_hop == 49152.0);
	assert_int_equal(ch.mode, RMOE_DISPATCH_RING_EXPERT);
	assert_non_null(strstr(ch.reason, "expert routing: 75.5 MB/hop of expert weights vs 405.8 MB/hop"));
	assert_true(ch.token_table2[0] == 204472320.0);
	free(e);
	rmoe_topology_free(&t);

	p.etp = 5;
	assert_int_equal(rmoe_routing_check(&p), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_strerror(RMOE_EINVAL), "ETP = 5"));
	p.etp = 1;
	p.ep = 3;
	assert_int_equal(rmoe_routing_check(&p), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_strerror(RMOE_EINVAL), "EP = 3"));
}

static enum rmoe_dispatch choose(struct rmoe_routing_problem p, const struct rmoe_ring_edge *e, double tflops)
{
	struct rmoe_routing_choice ch;
	int rc = rmoe_routing_choose(&p, e, (int)p.ep, tflops, &ch);
	if (rc)
		fail_msg("%s", rmoe_strerror(rc));
	return ch.mode;
}

static void test_planner_mode_follows_paper_trend(void **state)
{
	(void)state;
	struct rmoe_topology t;
	double tflops;
	struct rmoe_ring_edge *e = mn5_ring(8, &t, &tflops);
	/* §4.5: MoE-E384 with FFN 2048 at a short sequence (20K, b=12,
	 * SP*CP=8): the expert weights dwarf the tokens. */
	struct rmoe_routing_problem wide = {.hidden = 2048, .ffn = 2048, .experts = 384, .topk = 12,
	                                    .tokens = 12 * 20480 / 8, .ep = 8, .etp = 1,
	                                    .dtype = RMOE_DTYPE_BF16};
	assert_int_equal(choose(wide, e, tflops), RMOE_DISPATCH_RING_TOKEN);
	/* §4.2: E128 (Qwen3-30B-A3B's experts) at a long sequence (98K, b=12). */
	struct rmoe_routing_problem qwen = {.hidden = 2048, .ffn = 768, .experts = 128, .topk = 8,
	                                    .tokens = 12 * 98304 / 8, .ep = 8, .etp = 1,
	                                    .dtype = RMOE_DTYPE_BF16};
	assert_int_equal(choose(qwen, e, tflops), RMOE_DISPATCH_RING_EXPERT);
	/* The same E128 layer at a very short sequence flips to token routing;
	 * E384/F2048 stays on tokens even at the longest sequence tested. */
	qwen.tokens = 1024;
	assert_int_equal(choose(qwen, e, tflops), RMOE_DISPATCH_RING_TOKEN);
	wide.tokens = 12 * 98304 / 8;
	assert_int_equal(choose(wide, e, tflops), RMOE_DISPATCH_RING_TOKEN);
	/* §3.2: high ETP shrinks the expert volume and favours expert routing. */
	wide.etp = 64;
	assert_int_equal(choose(wide, e, tflops), RMOE_DISPATCH_RING_EXPERT);
	free(e);
	rmoe_topology_free(&t);
}

/* Whether every pass of both modes moves more time than it computes: there
 * the exposed time is the transfer less a common compute, so the choice
 * follows the bytes and flips at the volume crossover. */
static int transfer_bound(const struct rmoe_routing_problem *p, const struct rmoe_ring_edge *e, double rate)
{
	struct rmoe_routing_choice ch;
	if (rmoe_routing_choose(p, e, (int)p->ep, rate, &ch))
		return 0;
	for (int b = 0; b < 2; b++)
		if (ch.expert[b].transfer_s <= ch.expert[b].compute_s ||
		    ch.token[b].transfer_s <= ch.token[b].compute_s)
			return 0;
	return 1;
}

static void test_planner_mode_flips_at_crossover(void **state)
{
	(void)state;
	const int eps[] = {1, 4, 8, 16};
	int checked = 0;
	for (int ei = 0; ei < 4; ei++) {
		struct rmoe_topology t;
		double tflops;
		struct rmoe_ring_edge *e = mn5_ring(eps[ei], &t, &tflops);
		for (uint64_t trial = 0; trial < 40; trial++) {
			uint64_t r = rmoe_seeded_u64(SEED, 77, trial);
			struct rmoe_routing_problem p = {
				.hidden = 256 * (int64_t)(1 + r % 16), .ffn = 128 * (int64_t)(1 + (r >> 8) % 24),
				.experts = eps[ei] * (int64_t)(1 + (r >> 16) % 32), .topk = 1 + (int64_t)((r >> 24) % 8),
				.ep = eps[ei], .etp = (r >> 32) % 2 ? 2 : 1,
				.dtype = (r >> 40) % 2 ? RMOE_DTYPE_BF16 : RMOE_DTYPE_F32};
			if (p.topk > p.experts)
				p.topk = p.experts;
			int64_t x = rmoe_routing_crossover_tokens(&p);
			assert_true(x > 1);
			double rate = p.dtype == RMOE_DTYPE_BF16 ? tflops : t.f32_tflops;
			/* One rank moves nothing: both modes tie and the volume decides. */
			struct rmoe_routing_problem lo = p, hi = p;
			lo.tokens = x - 1;
			hi.tokens = x;
			if (eps[ei] > 1 && !(transfer_bound(&lo, e, rate) && transfer_bound(&hi, e, rate)))
				continue;
			checked++;
			assert_true(rmoe_token_hop_bytes_carried(&lo, 0) + rmoe_token_hop_bytes_carried(&lo, 1) <
			            rmoe_expert_hop_bytes(&lo, 0) + rmoe_expert_hop_bytes(&lo, 1));
			assert_int_equal(choose(lo, e, rate), RMOE_DISPATCH_RING_TOKEN);
			assert_true(rmoe_token_hop_bytes_carried(&hi, 0) + rmoe_token_hop_bytes_carried(&hi, 1) >=
			            rmoe_expert_hop_bytes(&hi, 0) + rmoe_expert_hop_bytes(&hi, 1));
			assert_int_equal(choose(hi, e, rate), RMOE_DISPATCH_RING_EXPERT);
		}
		free(e);
		rmoe_topology_free(&t);
	}
	/* Most seeded shapes are transfer-bound on this cluster's network. */
	assert_true(checked >= 60);
}

/* Qwen3-30B-A3B at full size, bf16, on 8 ranks of the MareNostrum 5 ACC
 * description, with the dispatch left to the plan. */
static void qwen3_layer(struct rmoe_layer_config *cfg)
{
	rmoe_layer_config_init(cfg);
	cfg->hidden = 2048;
	cfg->ffn = 768;
	cfg->experts = 128;
	cfg->topk = 8;
	cfg->tokens = 49152;
	cfg->dtype = RMOE_DTYPE_BF16;
	cfg->dispatch = RMOE_DISPATCH_AUTO;
}

/* The plan tests' fixture: that layer on nranks simulated ranks. */
struct plan_fixture {
	struct rmoe_topology t;
	struct rmoe_layer_config cfg;
};

static int plan_setup(void **state, int nranks)
{
	struct plan_fixture *f = calloc(1, sizeof(*f));
	struct rmoe_cluster c;
	if (!f || rmoe_cluster_load(RMOE_SOURCE_DIR "/scheduler/clusters/mn5-acc.cluster", &c))
		return -1;
	int rc = rmoe_topology_simulated(&c, NULL, nranks, &f->t);
	rmoe_cluster_free(&c);
	qwen3_layer(&f->cfg);
	*state = f;
	return rc;
}

static int plan_setup_4(void **state)
{
	return plan_setup(state, 4);
}

static int plan_setup_8(void **state)
{
	return plan_setup(state, 8);
}

static int plan_teardown(void **state)
{
	struct plan_fixture *f = *state;
	rmoe_topology_free(&f->t);
	free(f);
	return 0;
}

static void test_planner_plan_for_a_simulated_cluster(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_layer_config cfg = f->cfg;
	struct rmoe_plan_request req = {.layer = &cfg};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(plan.order[i], i);
	assert_int_equal(plan.node_crossings, 2);
	assert_true(plan.have_layer);
	/* §3.2: long sequences of few large experts favour expert routing. */
	assert_int_equal(plan.routing.mode, RMOE_DISPATCH_RING_EXPERT);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_EXPERT);
	assert_int_equal(plan.cap_rc, 0);
	assert_int_equal(plan.fit_rc, 0);
	assert_int_equal(plan.device.rank, -1);
	assert_int_equal(plan.device.memory_bytes, (int64_t)64 << 30);
	/* The memory section `relaymoe plan` printed for this configuration
	 * before the plan was one function: the largest local token counts in
	 * the device's 64 GiB. */
	assert_int_equal(plan.memory.max_tokens[0], 2481676);
	/* a2a-megatron keeps the all-to-all's buffers of that time; the lean
	 * a2a trains more tokens. */
	assert_int_equal(plan.memory.max_tokens[3], 461966);
	assert_int_equal(plan.memory.max_tokens[2], 535700);
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		struct rmoe_mem_config mc;
		struct rmoe_mem_estimate e;
		rmoe_mem_config_from_layer(&mc, &cfg, 8);
		assert_int_equal(rmoe_memory_model(rmoe_plan_dispatchers[i], &mc, &e), 0);
		assert_int_equal(plan.memory.est[i].peak, e.peak);
	}
	assert_int_equal(plan.memory.run.peak, plan.memory.est[0].peak);
	/* A requested dispatch is kept, whatever the routing choice says. */
	uint64_t digest = rmoe_plan_digest(&plan);
	rmoe_plan_free(&plan);
	cfg.dispatch = RMOE_DISPATCH_RING_TOKEN;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_TOKEN);
	assert_string_equal(plan.dispatch_reason, "token requested");
	assert_true(rmoe_plan_digest(&plan) != digest);
	rmoe_plan_free(&plan);
	cfg.dispatch = RMOE_DISPATCH_AUTO;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_true(rmoe_plan_digest(&plan) == digest);
	rmoe_plan_free(&plan);
}

/* The context's plan is the ring alone: the same order a layer's plan has. */
static void test_planner_plan_of_the_ring_only(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_plan_request req = {0};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_false(plan.have_layer);
	assert_int_equal(plan.nranks, 8);
	assert_int_equal(plan.node_crossings, 2);
	rmoe_plan_free(&plan);
	assert_int_equal(rmoe_plan_make(NULL, &t, &plan), RMOE_EINVAL);
}

/* The fit check compares the layer's modelled peak with the smallest
 * device memory over the ranks, and names that rank; unknown memory
 * (0) takes no part. */
static void test_planner_plan_fit_names_the_tightest_rank(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_layer_config cfg = f->cfg;
	struct rmoe_device_info dev[4];
	memset(dev, 0, sizeof(dev));
	const int64_t GiB = (int64_t)1 << 30;
	for (int r = 0; r < 4; r++) {
		dev[r].kind = RMOE_DEVICE_CUDA;
		dev[r].memory_bytes = 80 * GiB;
		snprintf(dev[r].source, sizeof(dev[r].source), "rank %d's probe", r);
	}
	dev[2].memory_bytes = 1 * GiB;
	dev[3].memory_bytes = 0;
	struct rmoe_plan_request req = {.layer = &cfg, .devices = dev};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.device.rank, 2);
	assert_int_equal(plan.device.kind, RMOE_DEVICE_CUDA);
	assert_true(plan.memory.run.peak > 1 * GiB);
	assert_int_equal(plan.fit_rc, RMOE_ENOMEM);
	assert_non_null(strstr(plan.fit_msg, "but rank 2 has 1.00 GiB (rank 2's probe)"));
	rmoe_plan_free(&plan);
	dev[2].memory_bytes = 80 * GiB;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.fit_rc, 0);
	rmoe_plan_free(&plan);
	for (int r = 0; r < 4; r++)
		dev[r].memory_bytes = 0;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.fit_rc, 0);
	assert_int_equal(plan.device.memory_bytes, 0);
	rmoe_plan_free(&plan);
}

/* Under a memory cap the plan chunks the ring's hops so that the modelled
 * peak of the worst routing stays within the cap; a cap below one row's
 * needs is a verdict, not a failure to plan. */
static void test_planner_plan_chunks_under_a_cap(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_layer_config cfg = f->cfg;
	cfg.dispatch = RMOE_DISPATCH_RING_EXPERT;
	struct rmoe_plan_request req = {.layer = &cfg};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	const int64_t whole = plan.memory.run.peak;
	rmoe_plan_free(&plan);
	cfg.mem_cap = whole * 3 / 4;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.cap_rc, 0);
	assert_true(plan.chunk_rows > 0 && plan.chunk_rows < cfg.tokens * cfg.topk);
	assert_true(plan.memory.run.peak <= cfg.mem_cap);
	struct rmoe_mem_config worst;
	struct rmoe_mem_estimate e;
	rmoe_mem_config_from_layer(&worst, &cfg, 4);
	worst.skew = 4;
	worst.chunk_rows = plan.chunk_rows;
	assert_int_equal(rmoe_memory_model(RMOE_DISPATCH_RING_EXPERT, &worst, &e), 0);
	assert_true(e.peak <= cfg.mem_cap);
	worst.chunk_rows = plan.chunk_rows + 1;
	assert_int_equal(rmoe_memory_model(RMOE_DISPATCH_RING_EXPERT, &worst, &e), 0);
	assert_true(e.peak > cfg.mem_cap - cfg.mem_cap / RMOE_CAP_HEADROOM);
	rmoe_plan_free(&plan);
	cfg.mem_cap = 1024;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.cap_rc, RMOE_EINVAL);
	assert_non_null(strstr(plan.cap_msg, "memory cap 1024 bytes is too small"));
	rmoe_plan_free(&plan);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_planner_parses_good_descriptions),
		cmocka_unit_test(test_planner_loads_shipped_clusters),
		cmocka_unit_test(test_planner_rejects_bad_descriptions_naming_the_line),
		cmocka_unit_test(test_planner_parser_survives_damaged_input),
		cmocka_unit_test(test_planner_topology_numbers_nodes_by_first_appearance),
		cmocka_unit_test(test_planner_ring_crosses_nodes_once_per_node),
		cmocka_unit_test(test_planner_ring_edges_carry_link_numbers),
		cmocka_unit_test(test_planner_ring_edges_share_a_node_adapter),
		cmocka_unit_test(test_planner_table2_volumes_by_hand),
		cmocka_unit_test(test_planner_mode_follows_paper_trend),
		cmocka_unit_test(test_planner_mode_flips_at_crossover),
		cmocka_unit_test_setup_teardown(test_planner_plan_for_a_simulated_cluster, plan_setup_8, plan_teardown),
		cmocka_unit_test_setup_teardown(test_planner_plan_of_the_ring_only, plan_setup_8, plan_teardown),
		cmocka_unit_test_setup_teardown(test_planner_plan_fit_names_the_tightest_rank, plan_setup_4,
		                                plan_teardown),
		cmocka_unit_test_setup_teardown(test_planner_plan_chunks_under_a_cap, plan_setup_4, plan_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
