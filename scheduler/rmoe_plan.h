/* scheduler/: the planner. A cluster description, the topology of the ranks
 * (hwloc on the local machine, one MPI gather for all ranks), the ring order,
 * and the choice between expert and token routing from the per-hop volumes
 * of the paper's Table 2 (§3.2).
 *
 * Everything here is pure except rmoe_local_hw_probe (hwloc) and
 * rmoe_topology_discover (hwloc + MPI), so the rest is unit-testable without
 * MPI or StarPU and identical on every rank given the same inputs.
 *
 * ---- Cluster description format -----------------------------------------
 *
 * Plain text, one `key = value` per line; `#` starts a comment anywhere on a
 * line; blank lines are ignored; keys are lower case. Lines before the first
 * section header describe the machine; headers open a section:
 *
 *   name = mn5-acc          # [A-Za-z0-9._-], at most 63 characters
 *   nodes = 1120            # nodes available
 *   devices_per_node = 4    # GPUs per node; 0 = CPU-only nodes
 *   ranks_per_node = 4      # MPI ranks placed on a node (block placement)
 *   gpu_link = nvlink       # GPU-GPU inside a node: nvlink | pcie
 *                           # (required only with devices_per_node > 1)
 *
 *   [device]                # one device (a GPU, or a node's CPUs if none)
 *   bf16_tflops = 400       # planning rate of the expert GEMMs, TFLOP/s
 *   f32_tflops = 50
 *   memory = 64G            # bytes; suffix K, M, G, T (KiB ... TiB) allowed
 *
 *   [link LINK]             # LINK: same_device | nvlink | pcie | shm | network
 *   bandwidth_gbs = 130     # GB/s (1e9 bytes/s) per direction, one rank pair
 *   latency_us = 2          # microseconds per message
 *
 *   [placement]             # optional: where each rank runs (simulations)
 *   rank_nodes = 0 1 0 1    # node of rank 0, 1, 2, ...
 *   rank_devices = 0 0 1 1  # optional: device of each rank on its node
 *
 * Links: same_device connects ranks sharing one GPU, nvlink/pcie two GPUs of
 * a node (per gpu_link), shm ranks of a node without GPUs (host shared
 * memory), network two nodes. A [link] is required when the machine uses it
 * (network with nodes > 1; gpu_link with devices_per_node > 1; same_device
 * with more ranks than devices per node; shm with CPU-only nodes and several
 * ranks per node); every other one is optional. The other top-level keys
 * and the three [device] keys are required. A key given twice, an unknown key or
 * section, a malformed or out-of-range number, a NUL byte, a placement
 * naming a node >= nodes or a device >= devices_per_node, or putting more
 * than ranks_per_node ranks on a node is an RMOE_EFORMAT error whose message
 * names the line. */
#ifndef RMOE_PLAN_H
#define RMOE_PLAN_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "rmoe_scheduler.h"

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

/* Reads and parses a file; errors are prefixed with its path (RMOE_EIO when
 * it cannot be read or is larger than RMOE_CLUSTER_MAX_FILE_BYTES). */
int rmoe_cluster_load(const char *path, struct rmoe_cluster *out);

void rmoe_cluster_free(struct rmoe_cluster *c);

/* ---- topology -------------------------------------------------------------- */

/* What hwloc sees on this machine. */
struct rmoe_local_hw {
	int cores, numa_nodes, gpus;
	int nvlink;                /* 1: NVLink between GPUs, 0: none, -1: hwloc cannot tell */
};
int rmoe_local_hw_probe(struct rmoe_local_hw *hw);

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

/* Collective over comm: probes this machine, gathers every rank's host name
 * and GPU count (MPI_Allgather), and builds the topology as
 * rmoe_topology_from_ranks does. cluster may be NULL. Every rank enters the
 * same collectives whatever fails, and returns the same code. */
int rmoe_topology_discover(MPI_Comm comm, const struct rmoe_cluster *cluster,
                           struct rmoe_topology *out);

/* The link between ranks a and b. */
enum rmoe_link_class rmoe_topology_link(const struct rmoe_topology *t, int a, int b);

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
	double bandwidth_gbs, latency_us;
};

/* Fills n = t->nranks edges; RMOE_EINVAL when order is not a permutation. */
int rmoe_ring_edges(const struct rmoe_topology *t, const int *order, struct rmoe_ring_edge *edges);

/* Edges of the order that join two nodes. */
int rmoe_ring_node_crossings(const struct rmoe_topology *t, const int *order);

/* Seconds to move bytes over the edge: latency + bytes / bandwidth. */
double rmoe_edge_seconds(const struct rmoe_ring_edge *e, double bytes);

/* The edge that takes longest for a message of bytes (the hop's pace). */
int rmoe_ring_slowest_edge(const struct rmoe_ring_edge *edges, int n, double bytes);

/* ---- routing mode (§3.2, Table 2) ----------------------------------------------- */

struct rmoe_routing_problem {
	int64_t hidden, ffn, experts, topk;  /* H, F, E, K */
	int64_t tokens;            /* B*S/(SP*CP): tokens resident on one rank */
	int64_t ep, etp;           /* ring ranks (EP); expert tensor parallelism (divides F) */
	enum rmoe_dtype dtype;     /* of activations and weights */
};

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
/* What this implementation's token ring carries per hop (graph/ring_token.c):
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

/* The smallest tokens per rank at which expert routing moves no more bytes
 * per hop than token routing: below it token routing is chosen, from it on
 * expert routing. Ignores p->tokens. */
int64_t rmoe_routing_crossover_tokens(const struct rmoe_routing_problem *p);

/* ---- the plan --------------------------------------------------------------------- */

/* Filled by the memory model (its own issue), not by this planner: peak
 * bytes per dispatcher and the largest tokens per rank that fit a budget. */
struct rmoe_plan_memory {
	int modelled;              /* 0: not modelled yet; the fields below are unset */
	int64_t peak_bytes_ring_expert, peak_bytes_ring_token, peak_bytes_alltoall;
	int64_t budget_bytes, largest_trainable_tokens;
};

struct rmoe_plan {
	int nranks;
	int *order;                /* [nranks] */
	struct rmoe_ring_edge *edges;   /* [nranks] */
	int node_crossings;
	struct rmoe_routing_choice routing;
	struct rmoe_plan_memory memory;
};

/* Ring order, its edges and the routing choice for p on t (p->ep must be
 * t->nranks). Pure. */
int rmoe_plan_make(const struct rmoe_topology *t, const struct rmoe_routing_problem *p,
                   struct rmoe_plan *out);
void rmoe_plan_free(struct rmoe_plan *plan);

#ifdef __cplusplus
}
#endif

#endif
