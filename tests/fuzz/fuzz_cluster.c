/* Fuzz target: the cluster-description parser (rmoe_cluster_parse) on raw
 * bytes, and for a description it accepts, what the context does next: a
 * simulated placement, the ring order and its edges. A refusal names a line;
 * an acceptance gives a machine the planner can use. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "rmoe_plan.h"
#include "rmoe_scheduler.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > (1 << 16))
		return 0;
	/* An exact-size copy without a NUL: the parser must not look past len. */
	char *text = malloc(size ? size : 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	struct rmoe_cluster c;
	int rc = rmoe_cluster_parse(text, size, &c);
	if (rc) {
		RMOE_FUZZ_REQUIRE(rc == RMOE_EFORMAT || rc == RMOE_ENOMEM);
		RMOE_FUZZ_REQUIRE(strstr(rmoe_strerror(rc), "line ") != NULL);
		RMOE_FUZZ_REQUIRE(c.rank_nodes == NULL && c.rank_devices == NULL);
		free(text);
		return 0;
	}
	RMOE_FUZZ_REQUIRE(c.nodes >= 1 && c.ranks_per_node >= 1 && c.devices_per_node >= 0);
	RMOE_FUZZ_REQUIRE(memchr(c.name, '\0', sizeof(c.name)) != NULL);
	/* The placement it describes, or a few block-placed ranks. */
	int nranks = c.nplaced > 0 ? c.nplaced : 1 + (int)(size % 16);
	if (nranks <= 4096) {
		struct rmoe_topology t;
		memset(&t, 0, sizeof(t));
		if (rmoe_topology_simulated(&c, NULL, nranks, &t) == 0) {
			int *order = malloc(sizeof(int) * (size_t)nranks);
			struct rmoe_ring_edge *edges = malloc(sizeof(*edges) * (size_t)nranks);
			if (order && edges && rmoe_ring_order(&t, order) == 0) {
				RMOE_FUZZ_REQUIRE(rmoe_ring_edges(&t, order, edges) == 0);
				RMOE_FUZZ_REQUIRE(rmoe_ring_node_crossings(&t, order) <= nranks);
			}
			free(order);
			free(edges);
		}
		rmoe_topology_free(&t);
	}
	rmoe_cluster_free(&c);
	free(text);
	return 0;
}
