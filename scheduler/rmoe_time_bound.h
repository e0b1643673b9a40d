/* The time bound of a layer's forward and backward per dispatcher: what no
 * schedule of its graph could beat on the described machine, from the
 * configuration alone. The terms are the simulation's (bench/sim/report.py,
 * bound()), with the bytes and the compute it measures derived here
 * instead:
 *   per pass, wire: the bytes the busiest rank sends over the link they
 *     must cross. A ring rank sends everything to its successor, over the
 *     slowest ring edge, plus one latency per hop. An all-to-all rank
 *     spreads its bytes evenly over its EP - 1 peers (even routing): those
 *     for other nodes leave through its network adapter, those for each
 *     node-mate over their pair link; the slower of the two, plus one
 *     latency.
 *   for both passes, compute: the GEMM flops one rank runs (router, experts
 *     at even routing, the shared expert) at the device's rate for the
 *     element type, the formulas of codelets/flops.c.
 *   bound = max(compute forward, wire forward) + max(compute backward,
 *     wire backward): a pass ends before the next starts, so each lasts at
 *     least the larger of its own two; serial = compute + wire (nothing
 *     overlapped).
 * The simulation's compute is the busiest GPU's executing time, which adds
 * a floor per task and the memory-bound kernels (gathers, scatters); they
 * are left out here, so compute and bound are lower bounds of the
 * simulated time. The simulation's own bound takes the larger of the two
 * totals, max(compute, wire forward + wire backward), as StarPU's worker
 * statistics give its compute for both passes together; where compute
 * and wire are close and one pass leans on each, the bound here is the
 * higher (MoE-H2048 at EP 8, its rings striped: the forward wire-bound,
 * the backward compute-bound). Pure. */
#ifndef RMOE_TIME_BOUND_H
#define RMOE_TIME_BOUND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rmoe_routing_problem;
struct rmoe_topology;
struct rmoe_ring_edge;
struct rmoe_dispatcher;

/* What the bound of a layer is computed from. */
struct rmoe_bound_input {
	const struct rmoe_routing_problem *p;  /* the layer on EP = t->nranks ranks */
	int64_t shared_ffn;                    /* the shared expert's width; 0: none */
	int shared_gated;                      /* its backward recomputes its output too */
	const struct rmoe_topology *t;
	const struct rmoe_ring_edge *edges;    /* [t->nranks]: the ring's edges */
	double tflops;                         /* the device's rate for p->dtype, TFLOP/s */
};

/* One pass of one dispatcher. */
struct rmoe_pass_bound {
	double bytes;              /* what the busiest rank sends in the pass */
	double flops;              /* what one rank computes in the pass */
	double compute_s;          /* flops at the device's rate */
	double wire_s;             /* bytes over the link they cross, with latency */
	int link;                  /* enum rmoe_link_class pacing wire_s; -1: nothing sent */
};

struct rmoe_time_bound {
	struct rmoe_pass_bound pass[2];   /* [0] forward, [1] backward */
	double compute_s, wire_s;  /* both passes */
	double bound_s;            /* sum over passes of max(compute, wire) */
	double serial_s;           /* compute_s + wire_s */
	/* Set by the plan from the memory model's peak (even routing): 1 fits,
	 * 0 does not, -1 unknown (no device memory known; no --mem-cap). Under
	 * the cap, a dispatcher that takes one fits when its chunks can meet
	 * it, one that takes none when its whole peak does. */
	int fits_device, fits_cap;
};

/* The dispatchers' traffic, one function per row of dispatchers.c (its
 * traffic member): the bytes one rank sends in the forward (bytes[0]) and
 * the backward (bytes[1]) at even routing, as its graph file sends them. */
void rmoe_traffic_ring_expert(const struct rmoe_routing_problem *p, double bytes[2]);
void rmoe_traffic_ring_token(const struct rmoe_routing_problem *p, double bytes[2]);
void rmoe_traffic_alltoall(const struct rmoe_routing_problem *p, double bytes[2]);
void rmoe_traffic_alltoall_megatron(const struct rmoe_routing_problem *p, double bytes[2]);
void rmoe_traffic_alltoall_deepep(const struct rmoe_routing_problem *p, double bytes[2]);

/* The GEMM flops one rank runs in a pass (backward: 1) at even routing. */
double rmoe_layer_pass_flops(const struct rmoe_bound_input *in, int backward);

/* The bound of the dispatcher of row on in (fits_* left at -1). 0, or
 * RMOE_EINVAL naming the problem (a row without traffic, such as auto; a
 * problem rmoe_routing_check refuses; EP other than the ranks; a rate that
 * is not positive). */
int rmoe_time_bound(const struct rmoe_dispatcher *row, const struct rmoe_bound_input *in,
                    struct rmoe_time_bound *out);

#ifdef __cplusplus
}
#endif

#endif
