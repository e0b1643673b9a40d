/* The plan: every decision taken before a layer's graph is built, in one
 * function, in the order they depend on each other: the ring (order and
 * edges), the routing mode (§3.2), the chunk rows under a memory cap, the
 * memory model's peaks, every dispatcher's time bound, and whether the
 * layer fits the memory of the device it runs on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_plan.h"

/* The ring: the planned order, or rank order when asked (the baseline the
 * planner is measured against, bench/multihost/); its edges either way. */
static int plan_ring(const struct rmoe_topology *t, int rank_order, struct rmoe_plan *out)
{
	out->nranks = t->nranks;
	out->order = malloc(sizeof(int) * (size_t)t->nranks);
	out->edges = malloc(sizeof(*out->edges) * (size_t)t->nranks);
	int rc = out->order && out->edges ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory for the plan");
	if (!rc && rank_order)
		for (int i = 0; i < t->nranks; i++)
			out->order[i] = i;
	else if (!rc)
		rc = rmoe_ring_order(t, out->order);
	if (!rc)
		rc = rmoe_ring_edges(t, out->order, out->edges);
	if (!rc)
		out->node_crossings = rmoe_ring_node_crossings(t, out->order);
	return rc;
}

/* §3.2's choice between expert and token routing (printed by the plan;
 * auto now weighs every dispatcher's bound, plan_auto) and the dispatch as
 * asked. */
static void plan_routing(const struct rmoe_layer_config *cfg, const struct rmoe_routing_problem *p,
                         const struct rmoe_topology *t, struct rmoe_plan *out)
{
	double tflops = p->dtype == RMOE_DTYPE_BF16 ? t->bf16_tflops : t->f32_tflops;
	if (rmoe_routing_choose(p, out->edges, t->nranks, tflops, &out->routing))
		snprintf(out->routing.reason, sizeof(out->routing.reason), "no routing choice: %s",
		         rmoe_last_error_message());
	out->dispatch = cfg->dispatch;
	snprintf(out->dispatch_reason, sizeof(out->dispatch_reason), "%s requested", rmoe_dispatch_name(cfg->dispatch));
}

/* Memory cap: the chunk size from the memory model, planned for the worst
 * routing (every pair of a rank in one partition), since a chunk bounds a
 * hop's rows (an all-to-all's block) whatever the skew. */
static int cap_chunk(enum rmoe_dispatch d, const struct rmoe_mem_config *mc, int64_t cap, int64_t *rows)
{
	struct rmoe_mem_config worst = *mc;
	worst.chunk_rows = 0;
	worst.skew = (double)mc->nranks;
	return rmoe_memory_cap_chunk(d, &worst, cap, rows);
}

/* Every dispatcher under the layer's cap, so the ring and the all-to-alls
 * compare at the chunking each would need (rmoe_plan_memory.cap_*). */
static void plan_cap_rows(const struct rmoe_layer_config *cfg, const struct rmoe_mem_config *mc, struct rmoe_plan *out)
{
	struct rmoe_plan_memory *m = &out->memory;
	for (int i = 0; cfg->mem_cap > 0 && i < RMOE_PLAN_NDISPATCHERS; i++) {
		m->cap_rc[i] = cap_chunk(rmoe_dispatchers[i].kind, mc, cfg->mem_cap, &m->cap_chunk_rows[i]);
		if (m->cap_rc[i])
			snprintf(m->cap_msg[i], sizeof(m->cap_msg[i]), "%s", rmoe_last_error_message());
	}
}

/* The dispatch that runs under the cap: its chunks, smaller ones asked for
 * kept, or why it cannot meet the cap. */
static void plan_cap(const struct rmoe_layer_config *cfg, struct rmoe_plan *out)
{
	out->chunk_rows = cfg->chunk_rows;
	if (cfg->mem_cap <= 0)
		return;
	const struct rmoe_plan_memory *m = &out->memory;
	out->cap_rc = RMOE_ENOTSUP;
	snprintf(out->cap_msg, sizeof(out->cap_msg), "%s takes no memory cap", rmoe_dispatch_name(out->dispatch));
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		if (rmoe_dispatchers[i].kind != out->dispatch)
			continue;
		out->cap_rc = m->cap_rc[i];
		if (out->cap_rc)
			snprintf(out->cap_msg, sizeof(out->cap_msg), "%s", m->cap_msg[i]);
		else if (out->chunk_rows <= 0 || out->chunk_rows > m->cap_chunk_rows[i])
			out->chunk_rows = m->cap_chunk_rows[i];
	}
}

static void plan_device(const struct rmoe_plan_request *req, const struct rmoe_topology *t, struct rmoe_plan *out)
{
	struct rmoe_plan_device *d = &out->device;
	d->rank = -1;
	if (!req->devices) {
		d->kind = t->device[0] >= 0 ? RMOE_DEVICE_CUDA : RMOE_DEVICE_CPU;
		d->memory_bytes = t->memory_bytes;
		snprintf(d->source, sizeof(d->source), "the device memory of the %s description", t->cluster);
		return;
	}
	for (int r = 0; r < t->nranks; r++) {
		const struct rmoe_device_info *i = &req->devices[r];
		if (i->memory_bytes <= 0)
			continue;
		if (d->rank < 0 || i->memory_bytes < d->memory_bytes) {
			d->rank = r;
			d->kind = i->kind;
			d->memory_bytes = i->memory_bytes;
			snprintf(d->source, sizeof(d->source), "%s", i->source);
		}
	}
	if (d->rank < 0) {
		d->kind = req->devices[0].kind;
		d->memory_bytes = 0;
		snprintf(d->source, sizeof(d->source), "unknown on every rank");
	}
}

/* A layer that cannot fit is refused at creation, on every rank, with what
 * it needs: not later in a StarPU allocation, which 1.3 retries forever, or
 * at the hands of the kernel's out-of-memory killer once pages are touched.
 * The model's estimate with even routing is a lower bound of what a pass
 * holds, so a refusal is never spurious. */
static void plan_fit(const struct rmoe_plan_request *req, struct rmoe_plan *out)
{
	const struct rmoe_plan_device *d = &out->device;
	const struct rmoe_mem_estimate *e = &out->memory.run;
	if (d->memory_bytes <= 0 || e->peak <= d->memory_bytes)
		return;
	const double GiB = 1073741824.0;
	char who[48];
	if (d->rank >= 0 && req->devices)
		snprintf(who, sizeof(who), "rank %d has", d->rank);
	else
		snprintf(who, sizeof(who), "a device has");
	out->fit_rc = RMOE_ENOMEM;
	snprintf(out->fit_msg, sizeof(out->fit_msg),
	         "the layer needs at least %.2f GiB on each rank (memory model, %s dispatch: %.2f GiB resident, "
	         "the rest a pass's temporaries) but %s %.2f GiB (%s): expected fewer tokens per rank, a smaller "
	         "layer or more ranks",
	         (double)e->peak / GiB, rmoe_dispatch_name(out->dispatch), (double)e->resident_backward / GiB, who,
	         (double)d->memory_bytes / GiB, d->source);
}

static void plan_memory(const struct rmoe_plan_request *req, const struct rmoe_mem_config *mc, struct rmoe_plan *out)
{
	struct rmoe_plan_memory *m = &out->memory;
	m->budget = req->budget > 0 ? req->budget : out->device.memory_bytes;
	struct rmoe_mem_config even = *mc;
	even.chunk_rows = 0;
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		rmoe_memory_model(rmoe_dispatchers[i].kind, &even, &m->est[i]);
		m->max_tokens[i] = m->budget > 0 ? rmoe_memory_max_tokens(rmoe_dispatchers[i].kind, &even, m->budget) : 0;
	}
}

/* The dispatch that runs, at its chunk rows: what the fit check compares
 * with the device's memory. */
static void plan_run_memory(const struct rmoe_mem_config *mc, struct rmoe_plan *out)
{
	struct rmoe_mem_config run = *mc;
	run.chunk_rows = out->chunk_rows;
	rmoe_memory_model(out->dispatch, &run, &out->memory.run);
}

/* The rings' bounds with their crossing hops striped as requested (0: as
 * planned). */
static int plan_striped(const struct rmoe_bound_input *flat, const int *order, int requested,
                        struct rmoe_plan_time *tb)
{
	const int n = flat->t->nranks;
	int *count = malloc(sizeof(int) * (size_t)n);
	struct rmoe_stripe *stripes = malloc(sizeof(*stripes) * (size_t)n * RMOE_STRIPES_MAX);
	struct rmoe_ring_edge *edges = malloc(sizeof(*edges) * (size_t)n);
	int rc = count && stripes && edges ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory striping the ring");
	if (!rc)
		rc = rmoe_ring_stripes(flat->t, order, requested, count, stripes);
	tb->stripes = rc ? 1 : rmoe_ring_stripes_most(count, n);
	if (!rc) {
		memcpy(edges, flat->edges, sizeof(*edges) * (size_t)n);
		rmoe_ring_edges_striped(flat->t, count, edges);
		struct rmoe_bound_input in = *flat;
		in.edges = edges;
		const enum rmoe_dispatch rings[2] = {RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_RING_TOKEN};
		for (int k = 0; k < 2 && !rc; k++)
			rc = rmoe_time_bound(rmoe_dispatcher_of(rings[k]), &in, &tb->striped[k]);
	}
	free(count);
	free(stripes);
	free(edges);
	return rc;
}

/* Every dispatcher's time bound over the planned ring (printed beside the
 * memory model's peaks; nothing chooses by it yet), and whether each one's
 * peak fits the device and the layer's cap (rmoe_time_bound.fits_*). */
static void plan_time(const struct rmoe_layer_config *cfg, const struct rmoe_routing_problem *p,
                      const struct rmoe_topology *t, struct rmoe_plan *out)
{
	struct rmoe_plan_time *tb = &out->time;
	const struct rmoe_plan_memory *m = &out->memory;
	tb->device_tflops = p->dtype == RMOE_DTYPE_BF16 ? t->bf16_tflops : t->f32_tflops;
	const struct rmoe_bound_input in = {.p = p, .shared_ffn = cfg->shared_ffn, .shared_gated = cfg->shared_gated,
	                                    .t = t, .edges = out->edges, .tflops = tb->device_tflops};
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS && !tb->rc; i++) {
		struct rmoe_time_bound *e = &tb->est[i];
		tb->rc = rmoe_time_bound(&rmoe_dispatchers[i], &in, e);
		int64_t peak = m->est[i].peak, dev = out->device.memory_bytes;
		e->fits_device = dev > 0 ? peak <= dev : -1;
		/* A cap it takes is met by chunking; one it does not, by the whole peak. */
		if (cfg->mem_cap > 0)
			e->fits_cap = m->cap_rc[i] == 0 || (m->cap_rc[i] == RMOE_ENOTSUP && peak <= cfg->mem_cap);
	}
	if (!tb->rc)
		/* --stripes 1 still prints the planned stripes beside the flat ring */
		tb->rc = plan_striped(&in, out->order, cfg->stripes == 1 ? 0 : cfg->stripes, tb);
	if (tb->rc)
		memset(tb->est, 0, sizeof(tb->est));
}

/* Whether the striped rings' peaks (the relays' pieces counted, even
 * routing, whole hops) fit the device. */
static void plan_striped_fit(const struct rmoe_mem_config *mc, struct rmoe_plan *out)
{
	struct rmoe_plan_time *tb = &out->time;
	const enum rmoe_dispatch rings[2] = {RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_RING_TOKEN};
	const int64_t dev = out->device.memory_bytes;
	for (int k = 0; k < 2 && !tb->rc && tb->stripes > 1; k++) {
		struct rmoe_mem_config c = *mc;
		struct rmoe_mem_estimate e;
		c.chunk_rows = 0;
		c.stripes = tb->stripes;
		if (rmoe_memory_model(rings[k], &c, &e) == 0) {
			tb->striped_peak[k] = e.peak;
			tb->striped[k].fits_device = dev > 0 ? e.peak <= dev : -1;
		}
	}
}

/* Why auto may not run row i of the layer (NULL: it may): a setting only
 * the rings take, whole blocks where chunks are asked for, a peak over the
 * cap or the device. */
static const char *auto_excluded(int i, const struct rmoe_layer_config *cfg, const struct rmoe_plan *out,
                                 int fits_device)
{
	const struct rmoe_dispatcher *row = &rmoe_dispatchers[i];
	if (cfg->partitions > 1 && row->family != RMOE_FAMILY_RING)
		return "no partitions";
	if (cfg->stripes > 1 && !row->striped)
		return "no stripes";
	if (cfg->chunk_rows > 0 && row->whole_blocks)
		return "whole blocks, not chunks";
	if (cfg->mem_cap > 0 && out->memory.cap_rc[i])
		return "over the cap";
	if (fits_device == 0)
		return "over the device";
	return NULL;
}

/* Issue 42, §3.2 generalised: auto runs the dispatcher with the smallest
 * time bound (the rings striped where the layer's stripes let them) among
 * those that may run the layer; bounds within RMOE_AUTO_TIE of the
 * smallest tie, and the smaller peak wins (compute-bound layers: the
 * all-to-alls' bound is the rings' compute). Nothing that may run: the
 * ring, whose cap and fit checks then say why. */
static void plan_auto(const struct rmoe_layer_config *cfg, struct rmoe_plan *out)
{
	out->auto_row = -1;
	if (rmoe_dispatcher_of(cfg->dispatch)->family != RMOE_FAMILY_CHOICE)
		return;
	const struct rmoe_plan_time *tb = &out->time;
	const struct rmoe_plan_memory *m = &out->memory;
	const int stripes = cfg->stripes != 1 ? tb->stripes : 1;
	const struct rmoe_time_bound *bound[RMOE_PLAN_NDISPATCHERS];
	const char *why[RMOE_PLAN_NDISPATCHERS];
	int best = -1;
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS && !tb->rc; i++) {
		const struct rmoe_dispatcher *row = &rmoe_dispatchers[i];
		int k = row->mode && !strcmp(row->mode, "token"); /* rmoe_plan_time.striped[k] */
		bound[i] = row->striped && stripes > 1 ? &tb->striped[k] : &tb->est[i];
		why[i] = auto_excluded(i, cfg, out, bound[i]->fits_device);
		if (why[i])
			continue;
		if (best < 0 || bound[i]->bound_s < bound[best]->bound_s)
			best = i;
	}
	int pick = best;
	for (int i = 0; best >= 0 && i < RMOE_PLAN_NDISPATCHERS; i++)
		if (!why[i] && bound[i]->bound_s <= bound[best]->bound_s * (1.0 + RMOE_AUTO_TIE) &&
		    m->est[i].peak < m->est[pick].peak)
			pick = i;
	char *r = out->dispatch_reason;
	const size_t len = sizeof(out->dispatch_reason);
	if (pick < 0) {
		out->dispatch = RMOE_DISPATCH_RING_EXPERT;
		snprintf(r, len, "ring: %s", tb->rc ? "no time bound to choose by" : "no dispatcher fits the cap and the device");
		return;
	}
	const struct rmoe_dispatcher *row = &rmoe_dispatchers[pick];
	const struct rmoe_time_bound *b = bound[pick];
	out->dispatch = row->kind;
	out->auto_row = pick;
	out->auto_striped = row->striped && stripes > 1;
	out->auto_bound_s = b->bound_s;
	size_t at = (size_t)snprintf(r, len, "%s%s: the smallest time bound that fits, %.4g ms (compute %.4g, wire %.4g), "
	                             "peak %.4g GiB%s; the others (ms):",
	                             row->name, out->auto_striped ? " striped" : "", b->bound_s * 1e3, b->compute_s * 1e3,
	                             b->wire_s * 1e3, (double)m->est[pick].peak / 1073741824.0,
	                             pick != best ? " (a tie, the smaller peak)" : "");
	const char *sep = " ";
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS && at < len; i++) {
		if (i == pick)
			continue;
		at += (size_t)snprintf(r + at, len - at, "%s%s %.4g%s%s%s", sep, rmoe_dispatchers[i].name,
		                       bound[i]->bound_s * 1e3, why[i] ? " (" : "", why[i] ? why[i] : "", why[i] ? ")" : "");
		sep = ", ";
	}
}

int rmoe_plan_make(const struct rmoe_plan_request *req, const struct rmoe_topology *t, struct rmoe_plan *out)
{
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_plan_make: out is NULL");
	memset(out, 0, sizeof(*out));
	if (!req || !t || t->nranks < 1)
		return rmoe_error(RMOE_EINVAL, "rmoe_plan_make: expected a request and a topology");
	int rc = plan_ring(t, req->rank_order, out);
	if (rc || !req->layer) {
		if (rc)
			rmoe_plan_free(out);
		return rc;
	}
	const struct rmoe_layer_config *cfg = req->layer;
	struct rmoe_routing_problem p = rmoe_routing_problem_of(cfg, t->nranks, req->etp);
	struct rmoe_mem_config mc;
	rmoe_mem_config_from_layer(&mc, cfg, t->nranks);
	mc.etp = p.etp;
	mc.runtime = req->runtime;
	out->have_layer = 1;
	plan_routing(cfg, &p, t, out);
	/* The rings' stripes as the layer asks, which the memory model counts
	 * (the relays' pieces) for every ring row; the other rows ignore them. */
	const int n = t->nranks;
	out->stripe_count = malloc(sizeof(int) * (size_t)n);
	out->stripes = malloc(sizeof(*out->stripes) * (size_t)n * RMOE_STRIPES_MAX);
	rc = out->stripe_count && out->stripes ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory for the plan's stripes");
	if (!rc)
		rc = rmoe_ring_stripes(t, out->order, cfg->stripes, out->stripe_count, out->stripes);
	if (rc) {
		rmoe_plan_free(out);
		return rc;
	}
	mc.stripes = rmoe_ring_stripes_most(out->stripe_count, n);
	plan_cap_rows(cfg, &mc, out);
	plan_device(req, t, out);
	plan_memory(req, &mc, out);
	plan_time(cfg, &p, t, out);
	plan_striped_fit(&mc, out);
	plan_auto(cfg, out);
	/* Only a striped dispatcher's graph stripes its hops. */
	if (!rmoe_dispatcher_of(out->dispatch)->striped) {
		rc = rmoe_ring_stripes(t, out->order, 1, out->stripe_count, out->stripes);
		if (rc) {
			rmoe_plan_free(out);
			return rc;
		}
		mc.stripes = 1;
	}
	plan_cap(cfg, out);
	plan_run_memory(&mc, out);
	plan_fit(req, out);
	return 0;
}

void rmoe_plan_free(struct rmoe_plan *plan)
{
	if (!plan)
		return;
	free(plan->order);
	free(plan->edges);
	free(plan->stripe_count);
	free(plan->stripes);
	plan->order = NULL;
	plan->edges = NULL;
	plan->stripe_count = NULL;
	plan->stripes = NULL;
	plan->nranks = 0;
}

uint64_t rmoe_plan_digest(const struct rmoe_plan *plan)
{
	uint64_t h = rmoe_hash_init();
	for (int i = 0; i < plan->nranks; i++)
		h = rmoe_hash_i64(h, plan->order[i]);
	if (!plan->have_layer)
		return h;
	h = rmoe_hash_i64(h, plan->dispatch);
	h = rmoe_hash_i64(h, plan->chunk_rows);
	h = rmoe_hash_i64(h, plan->cap_rc);
	h = rmoe_hash_i64(h, plan->fit_rc);
	for (int i = 0; plan->stripe_count && i < plan->nranks; i++)
		h = rmoe_hash_i64(h, plan->stripe_count[i]);
	return h;
}
