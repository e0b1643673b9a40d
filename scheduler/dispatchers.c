/* The dispatchers' traits, a row each (rmoe_dispatchers.h says what the
 * table is for). A row's flags are the facts the graphs and the model are
 * built on: change one only with the graph file it describes. */
#include <stdio.h>
#include <string.h>

#include "rmoe_dispatchers.h"
#include "rmoe_error.h"
#include "rmoe_time_bound.h"
#include "model/rmoe_model_terms.h"

/* The cap's refusal reads "a memory cap applies to the ring dispatchers
 * and a2a; <name> <no_cap>". */
const struct rmoe_dispatcher rmoe_dispatchers[RMOE_NDISPATCHERS] = {
	/* A chunk: gathered rows, workspace and outputs (three handles);
	 * gather, expert, scatter-add forward, the recompute's four tasks
	 * backward (graph/pass/chunk_tasks.c); the data they name and their
	 * arguments as counted (codelets/probe/bookkeeping.c) at 1024 and 256
	 * rows a chunk, the difference over the chunks'. */
	{.kind = RMOE_DISPATCH_RING_EXPERT, .name = "ring", .family = RMOE_FAMILY_RING, .mode = "expert",
	 .capped = 1, .chunked = "hops", .model = rmoe_model_ring_expert,
	 .traffic = rmoe_traffic_ring_expert, .runtime_fwd = {3, 3, 11, 248, 0, 0}, .runtime_bwd = {3, 4, 18, 368, 0, 0},
	 .striped = 1},
	{.kind = RMOE_DISPATCH_RING_TOKEN, .name = "token", .family = RMOE_FAMILY_RING, .mode = "token",
	 .capped = 1, .chunked = "hops", .model = rmoe_model_ring_token,
	 .traffic = rmoe_traffic_ring_token, .runtime_fwd = {3, 3, 11, 248, 0, 0}, .runtime_bwd = {3, 4, 18, 368, 0, 0},
	 .chunk_rows_of = RMOE_CHUNKS_COMPUTED, .striped = 1},
	/* Its blocks are one rank's pairs for one partition, as a ring hop's
	 * rows: the skew of a hop. */
	{.kind = RMOE_DISPATCH_ALLTOALL, .name = "a2a", .family = RMOE_FAMILY_ALLTOALL, .capped = 1,
	 .chunked = "exchanged blocks", .routing_blocks = 1, .model = rmoe_model_alltoall,
	 .traffic = rmoe_traffic_alltoall, .runtime_fwd = {5, 7.5, 16.5, 248, 1.5, 1.5},
	 .runtime_bwd = {9.5, 12.5, 37.5, 584, 3, 3}, .chunk_rows_of = RMOE_CHUNKS_BOTH},
	{.kind = RMOE_DISPATCH_ALLTOALL_MEGATRON, .name = "a2a-megatron", .family = RMOE_FAMILY_ALLTOALL,
	 .no_cap = "builds its top-k-expanded buffers whole", .rank_rows = 1, .model = rmoe_model_alltoall_megatron,
	 .traffic = rmoe_traffic_alltoall_megatron},
	/* Its receivers size a block by the distinct tokens in it, which the
	 * counts exchange carries per block, not per chunk; its index tasks
	 * (codelet_dedup.c) have a CPU function only. */
	{.kind = RMOE_DISPATCH_ALLTOALL_DEEPEP, .name = "a2a-deepep", .family = RMOE_FAMILY_ALLTOALL,
	 .whole_blocks = 1, .no_cap = "sends whole per-rank blocks", .cpu_tasks = 1, .peer_counts = 1,
	 .routing_blocks = 1, .model = rmoe_model_alltoall_deepep,
	 .traffic = rmoe_traffic_alltoall_deepep},
	{.kind = RMOE_DISPATCH_AUTO, .name = "auto", .family = RMOE_FAMILY_CHOICE, .capped = 1, .chunked = "hops",
	 .striped = 1},
};

const struct rmoe_dispatcher *rmoe_dispatcher_of(enum rmoe_dispatch d)
{
	for (int i = 0; i < RMOE_NDISPATCHERS; i++)
		if (rmoe_dispatchers[i].kind == d)
			return &rmoe_dispatchers[i];
	return NULL;
}

const char *rmoe_dispatch_name(enum rmoe_dispatch d)
{
	const struct rmoe_dispatcher *row = rmoe_dispatcher_of(d);
	return row ? row->name : "invalid";
}

char *rmoe_dispatch_names(char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int i = 0; i < RMOE_NDISPATCHERS && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? ", " : "", rmoe_dispatchers[i].name);
	return buf;
}

int rmoe_dispatch_parse(const char *name, enum rmoe_dispatch *d)
{
	for (int i = 0; i < RMOE_NDISPATCHERS; i++)
		if (name && strcmp(name, rmoe_dispatchers[i].name) == 0) {
			*d = rmoe_dispatchers[i].kind;
			return 0;
		}
	char names[128];
	return rmoe_error(RMOE_EINVAL, "dispatch '%s': expected one of %s", name ? name : "(null)",
	                  rmoe_dispatch_names(names, sizeof(names)));
}

int rmoe_dispatch_alltoall(enum rmoe_dispatch d)
{
	const struct rmoe_dispatcher *row = rmoe_dispatcher_of(d);
	return row && row->family == RMOE_FAMILY_ALLTOALL;
}
