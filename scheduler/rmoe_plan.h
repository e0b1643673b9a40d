/* scheduler/: the planner. A cluster description, the topology of the ranks
 * (what hwloc sees on each machine, system/local_hw.c, and one MPI gather
 * for all ranks), the ring order, and the choice between expert and token
 * routing from the per-hop volumes of the paper's Table 2 (§3.2).
 *
 * Everything here is pure, so it is unit-testable without MPI or StarPU and
 * identical on every rank given the same inputs: the context
 * (graph/context/ctx_ring.c, discover.c) gathers what every rank sees over MPI and
 * hands it here as plain data (rmoe_rank_info, rmoe_device_info); a
 * description is read from its file by system/ (rmoe_cluster_load).
 *
 * The cluster description format (rmoe_cluster_parse) is documented in
 * docs/planning.md, "The cluster format": keys, sections, which links are
 * required, and the errors, each naming its line. */
#ifndef RMOE_PLAN_H
#define RMOE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "rmoe_memory_model.h"
#include "rmoe_scheduler.h"
#include "rmoe_time_bound.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- links -------------------------------------------------------------- */

/* How two ranks exchange data, fastest first. */
enum rmoe_link_class {
	RMOE_LINK_SAME_DEVICE = 0, /* both ranks on one device: a device-local copy */
	RMOE_LINK_NVLINK,          /* two GPUs of a node over NVLink */
	RMOE_LINK_PCIE,            /* two GPUs of a node over PCIe */
	RMOE_LINK_SHM,             /* two ranks of a node through host shared memory */
	RMOE_LINK_NETWORK,         /* two nodes */
	RMOE_LINK_COUNT
};

/* "same_device", "nvlink", "pcie", "shm", "network" (the file's names). */
const char *rmoe_link_name(enum rmoe_link_class link);

struct rmoe_link {
	double bandwidth_gbs;      /* GB/s (1e9 bytes/s) per direction; 0 = not described */
	double latency_us;
};

/* ---- cluster description -------------------------------------------------- */

#define RMOE_CLUSTER_NAME_MAX 64
#define RMOE_CLUSTER_MAX_NODES 1000000
#define RMOE_CLUSTER_MAX_PER_NODE 4096
#define RMOE_CLUSTER_MAX_RANKS (1 << 20)
#define RMOE_CLUSTER_MAX_FILE_BYTES (16 << 20)

struct rmoe_cluster {
	char name[RMOE_CLUSTER_NAME_MAX];
	int nodes;
	int devices_per_node;      /* 0: CPU-only nodes */
	int ranks_per_node;
	enum rmoe_link_class gpu_link;   /* RMOE_LINK_NVLINK or RMOE_LINK_PCIE */
	struct rmoe_link link[RMOE_LINK_COUNT];
	double bf16_tflops, f32_tflops;  /* planning rates of one device */
	int64_t memory_bytes;            /* of one device */
	int nplaced;               /* ranks of the explicit placement; 0 = none */
	int *rank_nodes;           /* [nplaced] */
	int *rank_devices;         /* [nplaced], or NULL: rank's index on its node mod devices */
	int nics_per_node;         /* network adapters per node; 0 = one per ring edge */
};

/* The description used when no file is given: the link and per-device
 * numbers of scheduler/clusters/mn5-acc.cluster (H100 generation) on one
 * node. They are assumptions, and the plan says so; a file replaces them. */
void rmoe_cluster_defaults(struct rmoe_cluster *c);

/* Parses len bytes of text (not necessarily NUL-terminated; any byte value
 * is handled). 0, or RMOE_EFORMAT / RMOE_ENOMEM with a message naming the
 * line and the problem. On error *out holds no allocation; on success free
 * it with rmoe_cluster_free. No I/O. */
int rmoe_cluster_parse(const char *text, size_t len, struct rmoe_cluster *out);

void rmoe_cluster_free(struct rmoe_cluster *c);

/* ---- topology -------------------------------------------------------------- */

/* What hwloc sees on a machine (rmoe_local_hw_probe, system/). */
struct rmoe_local_hw {
	int cores, numa_nodes, gpus;
	int nvlink;                /* 1: NVLink between GPUs, 0: none, -1: hwloc cannot tell */
};

#define RMOE_HOST_MAX 256

/* What one rank reports about itself in the gather. */
struct rmoe_rank_info {
	char host[RMOE_HOST_MAX];  /* NUL-terminated */
	int gpus;                  /* GPUs hwloc sees on its machine */
	int nvlink;                /* as rmoe_local_hw.nvlink */
};

struct rmoe_topology {
	int nranks, nnodes;
	int *node;                 /* [nranks]; nodes numbered by first appearance in rank order */
	int *device;               /* [nranks]; device on its node, -1 = none (host memory) */
	enum rmoe_link_class gpu_link;   /* between two devices of a node */
	int gpu_link_known;        /* 0: NVLink could not be detected, PCIe assumed */
	struct rmoe_link link[RMOE_LINK_COUNT];
	double bf16_tflops, f32_tflops;
	int64_t memory_bytes;
	char cluster[RMOE_CLUSTER_NAME_MAX];   /* name of the description used */
	const char *placement;     /* how ranks were placed (a static sentence) */
	struct rmoe_local_hw local;      /* this machine; zeros when not probed */
	int nics_per_node;         /* the description's; 0 = an adapter per ring edge */
	char *hosts;               /* [nranks * RMOE_HOST_MAX]: each rank's host name
	                              from the gather; NULL when simulated */
};

/* From every rank's report (info[r] for rank r): nodes by host name, devices
 * by the rank's index on its node modulo the node's GPUs. With a cluster
 * description its links and rates replace the defaults, its devices_per_node
 * the GPU count, and its placement (which must name exactly nranks ranks)
 * the host names. Links the description leaves out keep the defaults'
 * numbers. Pure. */
int rmoe_topology_from_ranks(const struct rmoe_rank_info *info, int nranks,
                             const struct rmoe_cluster *cluster, struct rmoe_topology *out);

/* nranks ranks that do not all exist: the description's placement when it
 * names nranks ranks, else block placement of ranks_per_node ranks per node.
 * Without a description all ranks share this machine (local may be NULL:
 * no GPU). Pure. */
int rmoe_topology_simulated(const struct rmoe_cluster *cluster, const struct rmoe_local_hw *local,
                            int nranks, struct rmoe_topology *out);

/* The link between ranks a and b. */
enum rmoe_link_class rmoe_topology_link(const struct rmoe_topology *t, int a, int b);

/* Rank r's host name as MPI gave it, or NULL when the topology is simulated
 * or placed by a description. */
const char *rmoe_topology_host(const struct rmoe_topology *t, int r);

void rmoe_topology_free(struct rmoe_topology *t);

/* ---- ring order --------------------------------------------------------------- */

/* order[i] = rank at ring position i: ranks grouped by node, nodes in index
 * order, inside a node by device then rank (neighbouring positions share a
 * device or sit on the fastest intra-node link), so with several nodes the
 * ring crosses between nodes exactly once per node. Depends only on t. */
int rmoe_ring_order(const struct rmoe_topology *t, int *order);

/* Ring edge i: position i -> i + 1 (mod n). */
struct rmoe_ring_edge {
	int from, to;              /* ranks */
	enum rmoe_link_class link;
	double bandwidth_gbs, latency_us;   /* what this edge gets: see sharing */
	int sharing;               /* network edges sharing this one's busiest adapter
	                              (0: not a shared network edge) */
};

/* Fills n = t->nranks edges; RMOE_EINVAL when order is not a permutation.
 * With t->nics_per_node > 0, the network edges leaving a node share its
 * adapters, as do those entering one: an edge from node a to node b gets
 * the network bandwidth times nics / max(nics, edges leaving a, edges
 * entering b). In a ring in rank order over interleaved ranks every edge
 * leaves its node, so each gets a fraction; the planned order has one per
 * node. */
int rmoe_ring_edges(const struct rmoe_topology *t, const int *order, struct rmoe_ring_edge *edges);

/* Edges of the order that join two nodes. */
int rmoe_ring_node_crossings(const struct rmoe_topology *t, const int *order);

/* Per node, the order's edges that leave it (*out) and enter it (*in):
 * arrays of t->nnodes the caller frees. 0, or RMOE_ENOMEM. */
int rmoe_ring_node_edges(const struct rmoe_topology *t, const int *order, int **out, int **in);

/* Seconds to move bytes over the edge: latency + bytes / bandwidth. */
double rmoe_edge_seconds(const struct rmoe_ring_edge *e, double bytes);

/* The edge that takes longest for a message of bytes (the hop's pace). */
int rmoe_ring_slowest_edge(const struct rmoe_ring_edge *edges, int n, double bytes);

/* ---- the all-to-alls' exchange order (scheduler/exchange_order.c) ------------- */

/* to[k], from[k] for k < t->nranks: at step k rank me sends its block to
 * to[k] and receives from[k]'s; step 0 is its own (to = from = me). Every
 * step is a permutation of the ranks. On nodes of equal size the node's
 * own steps come first, then the other nodes', each step giving every
 * rank of a node a different rank of one other node; otherwise pairwise
 * (me + k, me - k). Depends only on t and me. */
int rmoe_exchange_order(const struct rmoe_topology *t, int me, int *to, int *from);

/* ---- striped crossing hops (scheduler/stripes.c) --------------------------------- */

/* One stripe of a ring edge: the rank that sends it over the network (out)
 * and the rank on the next node that receives it (in). Stripe 0 is the
 * edge's own (out = from, in = to); stripe j > 0 goes from -> out over the
 * GPU link, out -> in over the network, in -> to over the GPU link. */
struct rmoe_stripe {
	int out, in;
};

/* The stripes of the ring of order: count[i] for edge i, and
 * stripes[i * RMOE_STRIPES_MAX + j] for j < count[i]. An edge inside a node
 * has one; one that joins two nodes as many as requested (1: the flat
 * ring; 0: as planned), at most the adapters of either node
 * (nics_per_node, else one per rank), the ranks of either node and
 * RMOE_STRIPES_MAX, and only where the two nodes have no other crossing
 * edge out and in. The relays are each node's ranks in ring order from
 * the edge's end. 0, or RMOE_EINVAL naming a bad request. Pure. */
int rmoe_ring_stripes(const struct rmoe_topology *t, const int *order, int requested, int *count,
                      struct rmoe_stripe *stripes);

/* The most stripes any of n edges takes (count[n]); 1 for none. */
int rmoe_ring_stripes_most(const int *count, int n);

/* The edges (rmoe_ring_edges') as the striped ring sees them, for the
 * bound: an edge of S stripes moves S times as fast as the slower of its
 * network share and the GPU link, no faster than its node's adapters
 * shared among the node's crossing edges, with two GPU-link latencies
 * more for the relayed legs. */
void rmoe_ring_edges_striped(const struct rmoe_topology *t, const int *count, struct rmoe_ring_edge *edges);

/* ---- routing mode (§3.2, Table 2) ----------------------------------------------- */

struct rmoe_routing_problem {
	int64_t hidden, ffn, experts, topk;  /* H, F, E, K */
	int64_t tokens;            /* B*S/(SP*CP): tokens resident on one rank */
	int64_t ep, etp;           /* ring ranks (EP); expert tensor parallelism (divides F) */
	enum rmoe_dtype dtype;     /* of activations and weights */
};

/* The routing problem of a layer configuration on ep ranks with expert
 * tensor parallelism etp (<= 0: 1). */
struct rmoe_routing_problem rmoe_routing_problem_of(const struct rmoe_layer_config *cfg, int64_t ep, int64_t etp);

/* 0, or RMOE_EINVAL naming the value (sizes positive and bounded, K <= E,
 * E divisible by EP, F by ETP). */
int rmoe_routing_check(const struct rmoe_routing_problem *p);

/* Bytes per element of dtype. */
int rmoe_dtype_bytes(enum rmoe_dtype dtype);

/* M: routing metadata per token, K int32 expert indices + K fp32 weights. */
int64_t rmoe_routing_metadata_bytes(int64_t topk);

/* Table 2 per-hop volumes, in bytes; backward is twice forward in both
 * modes (weights + gradients; tokens + their gradients). */
double rmoe_expert_hop_bytes(const struct rmoe_routing_problem *p, int backward);
double rmoe_token_hop_bytes(const struct rmoe_routing_problem *p, int backward);
/* What this implementation's token ring carries per hop (graph/dispatch/ring_token.c):
 * Table 2's tokens and metadata plus the output accumulator, forward
 * T*(2H*s + 8K); backward x, dy, the dx accumulator and the routing with
 * dg, T*(3H*s + 12K). The routing choice uses these. */
double rmoe_token_hop_bytes_carried(const struct rmoe_routing_problem *p, int backward);

/* Expected expert GEMM flops of one hop: T*K/EP token-expert pairs under
 * uniform routing, 2*3*H*F/ETP flops each forward; backward recomputes the
 * forward and runs the data and weight gradients, 3x forward. */
double rmoe_hop_flops(const struct rmoe_routing_problem *p, int backward);

/* One hop, one direction, one mode. */
struct rmoe_hop_cost {
	double bytes;
	double transfer_s;         /* over the slowest ring edge; 0 with one rank */
	double compute_s;
	double exposed_s;          /* max(0, transfer - compute): what overlap cannot hide */
	double hidden_fraction;    /* of the transfer hidden behind compute (1 without transfer) */
	int slowest_edge;          /* index into the edges */
};

struct rmoe_routing_choice {
	enum rmoe_dispatch mode;   /* RMOE_DISPATCH_RING_EXPERT or RMOE_DISPATCH_RING_TOKEN */
	int tokens_travel;         /* 1: token routing (mode), 0: expert routing */
	struct rmoe_hop_cost expert[2], token[2];   /* [0] forward, [1] backward */
	double token_table2[2];    /* Table 2's token volumes, for comparison */
	double pairs_per_hop;
	double device_tflops;
	int64_t crossover_tokens;  /* see rmoe_routing_crossover_tokens */
	char reason[384];          /* one line with the numbers */
};

/* Chooses the mode with the smaller exposed communication per hop (forward
 * plus backward); ties, including both fully hidden, go to the smaller
 * volume, and equal volumes to expert routing (tokens stay where they are).
 * edges: the ring's n edges (n = p->ep). */
int rmoe_routing_choose(const struct rmoe_routing_problem *p, const struct rmoe_ring_edge *edges, int n,
                        double device_tflops, struct rmoe_routing_choice *out);

/* The time of a ring pass of n hops from one hop's cost, with transfers
 * overlapping compute (§3.1): the first hop computes the local partition,
 * each of the other n - 1 takes the longer of its transfer and its compute;
 * backward, each finished gradient then goes back to its owner (half a
 * backward hop's bytes, over the same slowest edge). Seconds. */
double rmoe_ring_pass_seconds(const struct rmoe_hop_cost *c, int64_t n, int backward);

/* The smallest tokens per rank at which expert routing moves no more bytes
 * per hop than token routing: below it token routing is chosen, from it on
 * expert routing. Ignores p->tokens. */
int64_t rmoe_routing_crossover_tokens(const struct rmoe_routing_problem *p);

/* ---- the plan --------------------------------------------------------------------- */

/* Where a rank's layer buffers live, as the context finds it when a layer is
 * created (graph/), handed to the planner as plain data. */
enum rmoe_device_kind {
	RMOE_DEVICE_CPU = 0,       /* host memory */
	RMOE_DEVICE_CUDA = 1,      /* a GPU's memory */
};

struct rmoe_device_info {
	int kind;                  /* enum rmoe_device_kind */
	int64_t memory_bytes;      /* what this rank may hold there; <= 0: unknown */
	char source[160];          /* how memory_bytes was found, a phrase */
};

/* What the plan is made for. */
struct rmoe_plan_request {
	/* The layer (shape, dtype, the dispatch asked for, chunk rows, memory
	 * cap); NULL plans the ring only, as a context does. */
	const struct rmoe_layer_config *layer;
	int64_t etp;               /* expert tensor parallelism, planning only (0: 1) */
	int64_t budget;            /* bytes for the largest-tokens search; 0: the device's memory */
	/* Each rank's device [topology nranks], as found on the live ranks; NULL:
	 * the topology's device (a cluster description, or the built-in one). */
	const struct rmoe_device_info *devices;
	/* 1: the ring in rank order, not the planned one: the baseline that the
	 * planned order is measured against (relaymoe run --ring-order rank). */
	int rank_order;
	/* The runtime's structures' bytes in this StarPU, which a memory cap
	 * holds beside the data (zeros: not counted, a plan without a
	 * context). */
	struct rmoe_runtime_units runtime;
};

/* The memory model at the planned configuration (scheduler/model/). The
 * plan compares every dispatcher but auto: the rows before it. */
enum { RMOE_PLAN_NDISPATCHERS = RMOE_NDISPATCHERS - 1 };
struct rmoe_plan_memory {
	/* The dispatchers of rmoe_dispatchers[] in their order, even
	 * routing, no chunking. */
	struct rmoe_mem_estimate est[RMOE_PLAN_NDISPATCHERS];
	int64_t max_tokens[RMOE_PLAN_NDISPATCHERS]; /* largest local token count whose peak fits budget */
	/* Under the layer's memory cap (mem_cap > 0), worst routing: each
	 * dispatcher's rows per chunk, or why it cannot meet the cap
	 * (RMOE_ENOTSUP: it takes no cap; RMOE_EINVAL: too small). */
	int64_t cap_chunk_rows[RMOE_PLAN_NDISPATCHERS];
	int cap_rc[RMOE_PLAN_NDISPATCHERS];
	char cap_msg[RMOE_PLAN_NDISPATCHERS][512];   /* why not, where cap_rc */
	int64_t budget;
	/* The dispatch that runs, with its chunk rows, even routing: what the
	 * fit check compares with the device's memory. */
	struct rmoe_mem_estimate run;
};

/* Every dispatcher's time bound at the planned configuration
 * (rmoe_time_bound.h), in the order of rmoe_dispatchers[], even routing,
 * with whether its memory model's peak fits the device and the cap. */
struct rmoe_plan_time {
	struct rmoe_time_bound est[RMOE_PLAN_NDISPATCHERS];
	/* The rings, expert [0] and token [1] routing, with their crossing
	 * hops striped over the nodes' adapters as planned (scheduler/stripes.c,
	 * graph/pass/stripes.c): their bounds, their peaks (even routing, whole
	 * hops, the relays' pieces counted) and whether those fit the device
	 * (fits_cap -1: the cap's chunks are planned for the layer's own
	 * stripes). stripes: the most any edge takes; 1: nothing to stripe. */
	struct rmoe_time_bound striped[2];
	int64_t striped_peak[2];
	int stripes;
	double device_tflops;      /* the rate its compute is taken at */
	int rc;                    /* 0, or why no bound could be made (est then zeros) */
};

/* The device the plan targets: the smallest memory over the ranks. */
struct rmoe_plan_device {
	int kind;                  /* enum rmoe_device_kind */
	int64_t memory_bytes;      /* <= 0: unknown (no fit check) */
	int rank;                  /* the rank with that memory; -1: the description's device */
	char source[160];
};

/* Bounds closer than this fraction of the smallest tie (plan_auto). */
#define RMOE_AUTO_TIE 0.005

/* Every decision taken before a layer's graph is built, made once by
 * rmoe_plan_make from the configuration and the topology, the same on every
 * rank (which compare its digest), used by the context (the ring) and by
 * layer creation (everything), and printed by `relaymoe plan`. */
struct rmoe_plan {
	int nranks;
	int *order;                /* [nranks]: the rank at each ring position */
	struct rmoe_ring_edge *edges;   /* [nranks]: position i -> i + 1 */
	int node_crossings;

	int have_layer;            /* 0: ring only; the fields below are unset */
	struct rmoe_routing_choice routing;   /* §3.2: expert vs token routing per hop */
	enum rmoe_dispatch dispatch;          /* what runs: as asked, or the choice for auto */
	/* RMOE_DISPATCH_AUTO: the dispatcher with the smallest time bound
	 * (rmoe_plan_time) among those that fit the device and the cap and take
	 * the layer's configuration; a bound within RMOE_AUTO_TIE of the
	 * smallest is a tie, which the smaller peak wins. auto_row: its row of
	 * rmoe_dispatchers[] (-1: asked for, not chosen); auto_striped: its
	 * bound is the striped ring's. */
	int auto_row, auto_striped;
	double auto_bound_s;
	char dispatch_reason[384];
	int64_t chunk_rows;        /* rows per chunk of a hop: as asked, or fewer under the cap */
	int cap_rc;                /* 0, or why the memory cap cannot be met (cap_msg) */
	char cap_msg[512];
	struct rmoe_plan_memory memory;
	struct rmoe_plan_time time;     /* printed, and what auto chooses by */
	struct rmoe_plan_device device;
	int fit_rc;                /* 0, or RMOE_ENOMEM: the layer does not fit (fit_msg) */
	char fit_msg[512];
	/* The stripes of each ring edge the layer's graph sends over
	 * (rmoe_ring_stripes; all 1 but for ring expert routing's crossing
	 * edges): stripe_count[nranks], stripes[nranks * RMOE_STRIPES_MAX]. */
	int *stripe_count;
	struct rmoe_stripe *stripes;
};

/* The plan of req on t. Pure: no MPI, no StarPU, no I/O. 0, or an RMOE_E*
 * code for inputs it cannot plan (the verdicts on the memory cap and on the
 * fit are fields, so that a plan that fails them can still be printed).
 * Free with rmoe_plan_free. */
int rmoe_plan_make(const struct rmoe_plan_request *req, const struct rmoe_topology *t, struct rmoe_plan *out);
void rmoe_plan_free(struct rmoe_plan *plan);

/* A digest of the plan's decisions, which every rank must share. */
uint64_t rmoe_plan_digest(const struct rmoe_plan *plan);

#ifdef __cplusplus
}
#endif

#endif
