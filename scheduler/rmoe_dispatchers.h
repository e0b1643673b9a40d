/* The dispatchers' traits: one row per dispatcher, the one place where
 * what sets a dispatcher apart is written (its name, whether it relays
 * around the ring or exchanges blocks, what chunking and a memory cap do to
 * it, what its tasks need, its memory model). Everything outside the rows
 * asks the row instead of testing the kind. graph/dispatch/table.c holds the
 * other half: each dispatcher's graph. Adding a dispatcher is one row here,
 * one there, and its graph file (docs/architecture.md). */
#ifndef RMOE_DISPATCHERS_H
#define RMOE_DISPATCHERS_H

#include <stddef.h>
#include <stdint.h>

#include "relaymoe/relaymoe.h"

#ifdef __cplusplus
extern "C" {
#endif

enum rmoe_dispatch_family {
	RMOE_FAMILY_RING,     /* hops around the ring (§3.1-§3.2): partitions, window slots */
	RMOE_FAMILY_ALLTOALL, /* blocks exchanged between every pair of ranks: no hops, no partitions */
	RMOE_FAMILY_CHOICE,   /* auto: one of the rings, chosen by the plan (§3.2) */
};

struct rmoe_model_terms;
struct rmoe_model_phase;
struct rmoe_mem_estimate;
struct rmoe_routing_problem;

/* A dispatcher's memory model: its dynamic peaks, forward and backward,
 * and largest buffer into p, and its own fields of o (fixed_backward,
 * per_row_backward, leaving_*), from the terms memory_model.c derives. 0,
 * or an error code. */
typedef int (*rmoe_model_fn)(const struct rmoe_model_terms *t, struct rmoe_model_phase *p,
                             struct rmoe_mem_estimate *o);

/* A dispatcher's traffic: the bytes one rank sends in the forward
 * (bytes[0]) and the backward (bytes[1]) at even routing, as its graph
 * sends them (scheduler/time_bound.c, rmoe_time_bound.h). */
typedef void (*rmoe_traffic_fn)(const struct rmoe_routing_problem *p, double bytes[2]);

/* The runtime's structures a graph makes per chunk of a hop or block (and,
 * the model takes it so, about as many per hop): StarPU handles and tasks,
 * the tasks' argument bytes, StarPU-MPI sends and receives. Counted
 * (codelets/probe/bookkeeping.c) at 2 ranks for 8 to 32 chunks a pass:
 * what one more chunk adds; an all-to-all's chunk of this rank's pairs
 * counts both roles (sender and owner of experts) and the half of the
 * blocks that stayed home, so its requests are rounded up to every block
 * crossing. */
struct rmoe_chunk_structs {
	double handles, tasks, task_buffers, arg_bytes, sends, recvs;
};

/* Which rows a pass's chunks cut: this rank's pairs (expert routing: its
 * tokens meet every partition), the pairs its experts compute (token
 * routing: the visiting partitions'), or both (an all-to-all: its blocks
 * out and its experts' blocks in). */
enum rmoe_chunked_rows { RMOE_CHUNKS_OWN = 0, RMOE_CHUNKS_COMPUTED, RMOE_CHUNKS_BOTH };

struct rmoe_dispatcher {
	enum rmoe_dispatch kind;
	const char *name;              /* as --dispatch and the configuration name it */
	enum rmoe_dispatch_family family;
	const char *mode;              /* a ring's routing in §3.2's words ("expert", "token"); NULL */
	unsigned whole_blocks : 1;     /* sends whole per-rank blocks: chunk_rows does not apply */
	unsigned capped : 1;           /* a memory cap plans its chunk rows */
	const char *no_cap;            /* why a cap does not apply, where it does not */
	const char *chunked;           /* what the cap's chunks split: "hops", "exchanged blocks" */
	unsigned cpu_tasks : 1;        /* some of its tasks have a CPU implementation only */
	unsigned peer_counts : 1;      /* its router also counts each peer's distinct tokens (E + N counts) */
	unsigned rank_rows : 1;        /* its largest buffers hold a rank's rows (the skew of a rank, not of
	                                  a hop) */
	unsigned routing_blocks : 1;   /* its model reads the routing's per-rank blocks where known */
	rmoe_model_fn model;           /* NULL for auto: the model of what it chooses */
	rmoe_traffic_fn traffic;       /* NULL for auto: the traffic of what it chooses */
	struct rmoe_chunk_structs runtime_fwd, runtime_bwd; /* per chunk; zeros where
	                                  no cap chunks it */
	enum rmoe_chunked_rows chunk_rows_of; /* the rows a pass cuts into chunks */
	int striped;                   /* its node-crossing hops go in stripes
	                                  (stripes.c; rmoe_layer_config.stripes) */
};

/* Every dispatcher, in the order the programs list them: the rings, the
 * all-to-alls, then auto, last (the plan compares the rows before it). A
 * new row goes before auto, with the count one more. */
#define RMOE_NDISPATCHERS 6
extern const struct rmoe_dispatcher rmoe_dispatchers[RMOE_NDISPATCHERS];

/* The row of d, or NULL for a value that names none. */
const struct rmoe_dispatcher *rmoe_dispatcher_of(enum rmoe_dispatch d);

/* The known names, comma-separated ("ring, token, ..."), into buf (len
 * bytes), for messages; rmoe_dispatch_name and rmoe_dispatch_parse
 * (relaymoe.h) read the rows too. Returns buf. */
char *rmoe_dispatch_names(char *buf, size_t len);

/* The all-to-alls (the lean one, Megatron's, DeepEP's) share their plan,
 * transfers and limits: no hops, no partitions. */
int rmoe_dispatch_alltoall(enum rmoe_dispatch d);

#ifdef __cplusplus
}
#endif

#endif
