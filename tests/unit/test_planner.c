/* The planner's cluster descriptions: good ones, the shipped ones, each way
 * one can be wrong (with the line named), and seeded random damage to a good
 * one. No MPI initialisation, no StarPU. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_main.h"
#include "rmoe_plan.h"
#include "rmoe_system.h"
#include "planner_check.h"
#include "seeded.h"

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

/* Lines of small: 2 name, 3 nodes, 4 devices_per_node, 5 ranks_per_node,
 * 6 gpu_link, 7 [device], 8 bf16, 9 f32, 10 memory, 11 [link pcie],
 * 12-13 its values, 14 [link network], 15-16 its values; appended text
 * starts on line 17. A description refused is small with one line replaced
 * (by its key) or with text appended; its message names the line and a
 * detail. */
static const struct {
	const char *key_line, *replacement, *line, *detail;
} bad_lines[] = {
	{"nodes = 2", "nodes = two", "line 3", "nodes 'two'"},
	{"nodes = 2", "nodes = 0", "line 3", "from 1"},
	{"nodes = 2", "nodes = 99999999999999999999999", "line 3", "nodes"},
	{"nodes = 2", "nodes = -2", "line 3", "nodes"},
	{"nodes = 2", "nodes 2", "line 3", "'key = value'"},
	{"nodes = 2", "= 2", "line 3", "a key before"},
	{"nodes = 2", "nodes =", "line 3", "a value"},
	{"nodes = 2", "nodez = 2", "line 3", "key 'nodez'"},
	{"name = small", "name = has space", "line 2", "name"},
	{"name = small", "name = \"quoted\"", "line 2", "name"},
	{"gpu_link = pcie", "gpu_link = infiniband", "line 6", "nvlink or pcie"},
	{"bf16_tflops = 100", "bf16_tflops = nan", "line 8", "bf16_tflops"},
	{"bf16_tflops = 100", "bf16_tflops = inf", "line 8", "bf16_tflops"},
	{"bf16_tflops = 100", "bf16_tflops = 0", "line 8", "positive"},
	{"memory = 16G", "memory = 16Q", "line 10", "memory '16Q'"},
	{"memory = 16G", "memory = 0.5", "line 10", "memory"},
	{"memory = 16G", "memory = GiB", "line 10", "memory"},
	{"bandwidth_gbs = 50", "bandwidth_gbs = -50", "line 12", "bandwidth_gbs"},
	{"latency_us = 3", "latency_us = 1e9", "line 13", "latency_us"},
	{"[link pcie]", "[link infiniband]", "line 11", "same_device, nvlink"},
	{"[link pcie]", "[links]", "line 11", "section"},
	{"[link pcie]", "[link pcie", "line 11", "section header"},
	{"[device]", "[node]", "line 7", "section"},
	/* Missing pieces, reported at the end of input. */
	{"nodes = 2", "# no nodes", "end of input", "'nodes' is missing"},
	{"memory = 16G", "", "end of input", "'memory' is missing"},
	{"gpu_link = pcie", "", "end of input", "gpu_link"},
	{"[link network]", "[link shm]", "end of input", "[link network]"},
	{"ranks_per_node = 2", "ranks_per_node = 3", "end of input", "[link same_device]"},
	{"latency_us = 3", "", "line 12", "no latency_us"},
};

static const struct {
	const char *text, *line, *detail;
} bad_appended[] = {
	/* A key of another section. */
	{"nodes = 3\n", "line 17", "in [link]"},
	{"[device]\nlatency_us = 1\n", "line 18", "in [device]"},
	/* Set twice. */
	{"[device]\nmemory = 8G\n", "line 18", "already set on line 10"},
	{"[link network]\nlatency_us = 9\n", "line 18", "already set on line 16"},
	/* Placements that contradict the machine. */
	{"[placement]\nrank_nodes = 0 1 2\n", "line 18", "node 2"},
	{"[placement]\nrank_nodes = 0 1 x\n", "line 18", "entry 2 of rank_nodes"},
	{"[placement]\nrank_nodes = 0 0 0 1\n", "line 18", "more than ranks_per_node"},
	{"[placement]\nrank_nodes = 0 1\nrank_devices = 0\n", "line 19", "lists 1"},
	{"[placement]\nrank_nodes = 0 1\nrank_devices = 0 2\n", "line 19", "device 2"},
	{"[placement]\nrank_devices = 0 1\n", "line 18", "needs rank_nodes"},
};

static void test_planner_rejects_bad_descriptions_naming_the_line(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(bad_lines) / sizeof(bad_lines[0]); i++)
		expect_bad_variant(bad_lines[i].key_line, bad_lines[i].replacement, bad_lines[i].line,
		                   bad_lines[i].detail);
	for (size_t i = 0; i < sizeof(bad_appended) / sizeof(bad_appended[0]); i++)
		expect_bad_variant(NULL, bad_appended[i].text, bad_appended[i].line, bad_appended[i].detail);
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

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_planner_parses_good_descriptions),
               cmocka_unit_test(test_planner_loads_shipped_clusters),
               cmocka_unit_test(test_planner_rejects_bad_descriptions_naming_the_line),
               cmocka_unit_test(test_planner_parser_survives_damaged_input))
