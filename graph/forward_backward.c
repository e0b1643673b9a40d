/* A layer's two passes: the router, the shared expert, then the planned
 * dispatch graph; the pass's peak memory and time recorded. */
#include <stdlib.h>
#include <string.h>

#include "rmoe_dispatch.h"
#include "rmoe_system.h"

/* ---- the router -------------------------------------------------------------------- */

static struct rmoe_router_shape router_shape(const struct rmoe_layer *L)
{
	return (struct rmoe_router_shape){L->T, L->H, L->E, L->K, L->cfg.norm_topk};
}

/* Router and dispatch map first: everything else waits for their counts. */
static int submit_router_fwd(struct rmoe_layer *L)
{
	const int top = starpu_sched_get_max_priority();
	/* No tokens here: no task touches a buffer of no element (a device
	 * allocates none), the counts are zero. */
	if (L->T == 0) {
		int rc = rmoe_pass_zero(L, NULL, L->h_counts, L->E, top, "zero-counts");
		if (!rc && L->traits->peer_counts)
			rc = rmoe_pass_zero(L, NULL, L->h_peer_counts, L->E + L->N, top, "zero-counts");
		return rc;
	}
	struct rmoe_router_shape s = router_shape(L);
	struct rmoe_task_opts o = rmoe_opts(L, "router-fwd", top);
	int rc = rmoe_insert_router_fwd(&o, &s, L->h_x, L->h_w_router, L->h_probs, L->h_topk_idx, L->h_topk_w);
	o = rmoe_opts(L, "dispatch-map", top);
	if (!rc)
		rc = rmoe_insert_dispatch_map(&o, L->T, L->K, L->E, L->h_topk_idx, L->h_pair_order, L->h_counts);
	o = rmoe_opts(L, "peer-counts", top);
	if (!rc && L->traits->peer_counts)
		rc = rmoe_insert_peer_counts(&o, L->T, L->K, L->E, L->N, L->h_topk_idx, L->h_counts, L->h_peer_counts);
	return rc;
}

static int submit_router_bwd(struct rmoe_layer *L, starpu_data_handle_t dx, starpu_data_handle_t dprobs)
{
	struct rmoe_router_shape s = router_shape(L);
	struct rmoe_task_opts o = rmoe_opts(L, "router-bwd", 0);
	/* No tokens here: this rank's part of the router's gradient is zero. */
	if (L->T == 0)
		return rmoe_pass_zero(L, NULL, L->h_dw_router, L->H * L->E, 0, "zero-grad");
	return rmoe_insert_router_bwd(&o, &s, L->h_x, L->h_w_router, L->h_probs, L->h_topk_idx, L->h_topk_w, L->h_dg,
	                              dprobs, dx, L->h_dw_router);
}

/* The host needs the per-expert counts to size the hops' buffers: the one
 * synchronisation point of a forward (Megatron's dispatcher has the same).
 * What the graph does next depends on them, so whether the router's tasks
 * succeeded is agreed here: a rank whose router failed would otherwise
 * build no dispatch graph while the others wait inside theirs. */
static int read_counts(struct rmoe_layer *L, struct rmoe_pass *pass)
{
	/* A dispatcher that counts peers reads the expert counts in its peer
	 * counts, which come after them (one wait either way). */
	int32_t *counts;
	starpu_data_handle_t h = rmoe_counts_handle(L, &counts);
#ifdef STARPU_SIMGRID
	/* The router did not run: synthetic counts (sim_routing.c), written
	 * into the handle so the counts exchange carries them. */
	int rc = rmoe_acquire_bounded(pass->wait, h, STARPU_MAIN_RAM, STARPU_RW, "the expert counts");
	if (rc)
		return rc;
	rmoe_sim_rank_counts(L, L->ctx->rank, counts);
#else
	int rc = rmoe_acquire_bounded(pass->wait, h, STARPU_MAIN_RAM, STARPU_R, "the expert counts");
	if (rc)
		return rc;
#endif
	rmoe_counts_offsets(counts, L->E, L->expert_offsets);
	starpu_data_release(h);
	rc = rmoe_task_status_check(L->tasks);
	if (!rc && L->expert_offsets[L->E] != L->T * L->K)
		rc = rmoe_error(RMOE_ESTARPU, "dispatch map counted %lld pairs, expected %lld",
		                (long long)L->expert_offsets[L->E], (long long)(L->T * L->K));
	rc = rmoe_agree_first(pass->wait, L->ctx->comm, rc, "the router's tasks");
	pass->agreed = rc != 0;
	return rc;
}

/* ---- the shared expert: all of this rank's tokens, outside the ring ------------------- */

static int submit_shared_fwd(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	int64_t rows = L->T;
	starpu_data_handle_t work = rmoe_act_vector(pass, L, rows * 3 * L->Fs);
	starpu_data_handle_t out = rmoe_act_vector(pass, L, rows * L->H);
	int rc = rmoe_pass_expert_ffn(L, NULL, L->h_x, L->h_ws, 1, L->Fs, &rows, rows, work, out, 0, "shared-ffn");
	struct rmoe_task_opts o = rmoe_opts(L, "shared-gate-fwd", 0);
	if (!rc && L->cfg.shared_gated)
		rc = rmoe_insert_shared_gate_fwd(&o, rows, L->H, L->h_x, L->h_w_sgate, out);
	if (!rc)
		/* The pass waits for the shared expert before the dispatch starts
		 * (rmoe_layer_forward): the two never hold buffers at once. */
		rc = rmoe_pass_accumulate(L, pass, out, y, rows * L->H, 0, "shared-add");
	starpu_data_unregister_submit(work);
	starpu_data_unregister_submit(out);
	return rc;
}

static int submit_shared_bwd(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                             starpu_data_handle_t dx)
{
	int64_t rows = L->T;
	const int gated = L->cfg.shared_gated;
	starpu_data_handle_t work = rmoe_act_vector(pass, L, rows * 3 * L->Fs);
	starpu_data_handle_t dxs = rmoe_act_vector(pass, L, rows * L->H);
	/* Gated (Qwen2-MoE): the gate's gradient reads the ungated output, so
	 * the recompute runs the whole FFN; the gate's backward then turns that
	 * output into the gated dy the expert's backward takes. */
	starpu_data_handle_t out = gated ? rmoe_act_vector(pass, L, rows * L->H) : NULL;
	int rc = rmoe_pass_expert_ffn(L, NULL, L->h_x, L->h_ws, 1, L->Fs, &rows, rows, work, out, 0,
	                              "shared-recompute");
	struct rmoe_task_opts o = rmoe_opts(L, "shared-gate-bwd", 0);
	if (!rc && gated)
		rc = rmoe_insert_shared_gate_bwd(&o, rows, L->H, L->h_x, L->h_w_sgate, dy, out, dx, L->h_dw_sgate);
	o = rmoe_opts(L, "shared-bwd", 0);
	struct rmoe_expert_shape s = {L->H, L->Fs, 1, rows, &rows};
	if (!rc)
		rc = rmoe_insert_expert_bwd_preweighted(&o, &s, 0, L->h_x, gated ? out : dy, L->h_ws, work, dxs, L->h_dws);
	if (!rc)
		rc = rmoe_pass_accumulate(L, pass, dxs, dx, rows * L->H, 0, "shared-dx");
	starpu_data_unregister_submit(work);
	starpu_data_unregister_submit(dxs);
	if (out)
		starpu_data_unregister_submit(out);
	return rc;
}

/* ---- recording ----------------------------------------------------------------------- */

/* A pass's measurement: both probes' levels at its start, and whether the
 * sampler thread runs for it. */
struct measure {
	int64_t starpu_base, heap_base;
	int64_t runtime_base; /* rmoe_bookkeeping_bytes at the start */
	int sampling;
};

/* Starts a pass's measurement: the probes' peaks and the process's. The
 * sampler first, so the bases are taken with it running; after the pass's
 * edges, so a staging copy (counted in the resident part) is in the heap's
 * base, not twice. */
static void measure_start(struct measure *m)
{
	m->sampling = rmoe_sampler_start() == 0;
	rmoe_probe_reset();
	rmoe_host_peak_rss_reset();
	m->starpu_base = rmoe_probe_current();
	m->heap_base = rmoe_heap_reset();
	m->runtime_base = rmoe_bookkeeping_bytes();
}

/* Every pass that started a measurement ends it, recorded or not. */
static void measure_stop(struct measure *m)
{
	if (m->sampling)
		rmoe_sampler_stop();
	m->sampling = 0;
}

/* The public statistics keep a field of each kind per pass: one pass's. */
struct pass_stats {
	int64_t *runtime, *device_peak, *peak, *heap, *sent;
	double *seconds;
	int *host_waits;
};

static struct pass_stats pass_stats(struct rmoe_layer_stats *s, int backward)
{
	if (backward)
		return (struct pass_stats){&s->runtime_backward_bytes, &s->peak_device_backward_bytes,
		                           &s->peak_backward_bytes, &s->peak_heap_backward_bytes, &s->bytes_sent_backward,
		                           &s->backward_seconds, &s->host_waits_backward};
	return (struct pass_stats){&s->runtime_forward_bytes, &s->peak_device_forward_bytes, &s->peak_forward_bytes,
	                           &s->peak_heap_forward_bytes, &s->bytes_sent_forward, &s->forward_seconds,
	                           &s->host_waits_forward};
}

static void record(struct rmoe_layer *L, struct rmoe_pass *pass, struct measure *m, double t0)
{
	double secs = (starpu_timing_now() - t0) * 1e-6;
	measure_stop(m);
	int64_t dyn = rmoe_probe_peak() - m->starpu_base;
	if (dyn < 0)
		dyn = 0;
	/* The pass's own host buffers (striped slots) are in its resident
	 * bytes and were malloc'ed during it: counted once. */
	int64_t heap = rmoe_heap_peak() - m->heap_base - pass->owned_bytes;
	if (heap < 0)
		heap = 0;
	int64_t resident = L->resident_bytes + pass->resident;
	struct pass_stats st = pass_stats(&L->stats, pass->backward);
	*st.runtime = rmoe_bookkeeping_bytes() - m->runtime_base;
	*st.device_peak = rmoe_probe_device_peak();
	*st.seconds = secs;
	*st.peak = resident + dyn;
	*st.heap = resident + heap;
	*st.sent = pass->bytes_sent;
	*st.host_waits = pass->host_waits;
	L->stats.resident_bytes = resident;
	if (pass->largest_temporary > L->stats.largest_temporary_bytes)
		L->stats.largest_temporary_bytes = pass->largest_temporary;
	/* forward and backward together: the larger of the two passes */
	int64_t rss = rmoe_host_peak_rss();
	if (!pass->backward || rss > L->stats.peak_rss_bytes)
		L->stats.peak_rss_bytes = rss;
	L->stats.hops = L->traits->family == RMOE_FAMILY_RING ? L->N : 0;
	L->stats.chunk_rows = L->cfg.chunk_rows;
}

/* An application's buffer as a pass sees it: a float32 array of the
 * float32 calls (the array itself in a float32 layer, else a staging copy
 * in the layer's element type, converted back at the end), or a _raw call's
 * buffer in the layer's element type on memory node node, registered as it
 * is. */
struct edge {
	float *user;           /* the float32 call's array; NULL for a raw buffer */
	void *buf;             /* what is registered */
	int64_t n;
	size_t elsize;
	starpu_data_handle_t h;
};

/* read: the pass reads the buffer; else it adds into it from zero (zeroed
 * here on the host, by a task where a raw buffer lives). */
static int edge_open(const struct rmoe_layer *L, struct rmoe_pass *pass, struct edge *e, float *user, void *raw, int node, int64_t n,
                     size_t elsize, int read)
{
	*e = (struct edge){.user = raw ? NULL : user, .buf = raw, .n = n, .elsize = elsize};
	if (n == 0) {
		/* No tokens here: the caller's pointers may be NULL, and StarPU
		 * takes a registered buffer at address 0 for one never allocated. */
		static uint32_t none;
		e->user = NULL;
		e->buf = &none;
		e->h = rmoe_node_vector(pass, STARPU_MAIN_RAM, e->buf, 0, elsize);
		return 0;
	}
	if (!raw) {
		e->buf = elsize == sizeof(float) ? (void *)user : malloc((size_t)n * elsize);
		if (!e->buf)
			return rmoe_error(RMOE_ENOMEM, "out of host memory for a staging copy of %lld values", (long long)n);
		if (read && e->buf != user)
			rmoe_to_elements(user, e->buf, n, elsize);
		else if (!read)
			memset(e->buf, 0, (size_t)n * elsize);
	}
	e->h = rmoe_node_vector(pass, raw ? node : STARPU_MAIN_RAM, e->buf, n, elsize);
	return raw && !read ? rmoe_pass_zero(L, pass, e->h, n, starpu_sched_get_max_priority(), "zero-output") : 0;
}

/* Unregistering brings the data to the buffer's own memory; a staging
 * copy is converted back into the application's array when writeback. */
static void edge_close(struct edge *e, int writeback)
{
	if (e->h)
		starpu_data_unregister(e->h);
	if (e->user && e->buf != e->user) {
		if (writeback)
			rmoe_from_elements(e->buf, e->user, e->n, e->elsize);
		free(e->buf);
	}
	e->h = NULL;
}

/* The forward's token counts, every rank's (L->rank_tokens): the largest
 * grows the capacity where it exceeds it, on every rank alike, unless a
 * memory cap was planned for the capacity; then the kept buffers are
 * registered for this rank's count. */
static int take_counts(struct rmoe_layer *L, struct rmoe_pass *pass)
{
	int64_t most = 0;
	int at = 0;
	for (int r = 0; r < L->N; r++)
		if (L->rank_tokens[r] > most) {
			most = L->rank_tokens[r];
			at = r;
		}
	if (most > L->cap && L->cfg.mem_cap > 0)
		return rmoe_error(RMOE_EINVAL,
		                  "rank %d: %lld tokens, more than the capacity of %lld tokens that mem_cap = %lld "
		                  "was planned for: create the layer with tokens >= %lld",
		                  at, (long long)most, (long long)L->cap, (long long)L->cfg.mem_cap, (long long)most);
	L->T_max = most;
	int rc = rmoe_layer_resize(L, L->next_T, most > L->cap ? most : L->cap);
	return rmoe_agree_first(pass->wait, L->ctx->comm, rc, "registering the token count");
}

/* A pass begins once every rank's checks agree (checked collectively: a
 * rank that returned alone would leave the others waiting for it inside the
 * pass): its start time and its block of tags. */
static int pass_begin(struct rmoe_layer *L, struct rmoe_pass *pass, int rc, const char *what, double *t0)
{
	/* A forward shares every rank's token count in the same collective. */
	if (pass->backward)
		rc = rmoe_agree_first(pass->wait, L->ctx->comm, rc, what);
	else if (!(rc = rmoe_agree_first_gather(pass->wait, L->ctx->comm, rc, what, L->next_T, L->rank_tokens)))
		rc = take_counts(L, pass);
	if (rc)
		return rc;
	rmoe_task_status_reset(L->tasks);
	*t0 = starpu_timing_now();
	/* Whole blocks of RMOE_PASS_TAGS(N): a pass that needs more (the
	 * pipelined all-to-all's chunks) takes several, so every pass starts
	 * on a block boundary and a trace's tags decode pass by pass
	 * (scripts/trace/rmoe_trace.py). */
	const int64_t block = RMOE_PASS_TAGS(L->N);
	int64_t tags = block;
	if (L->ops->tags && L->ops->tags(L) > tags)
		tags = (L->ops->tags(L) + block - 1) / block * block;
	/* A striped ring's pieces take a block per leg (stripes.c). */
	if (L->striped && tags < RMOE_STRIPE_LEGS * block)
		tags = RMOE_STRIPE_LEGS * block;
	return rmoe_tags_reserve(L->ctx, tags, &pass->tag_base);
}

/* A pass's end once its tasks have ended (rmoe_pass_finish): what failed
 * on this rank (rc, or a task's failure as its status recorded it), agreed
 * on every rank, so that a task that failed on one rank fails the call on
 * all of them, naming the task and the rank. Not after RMOE_EPEER: a rank
 * is missing, and nothing more is waited for. */
static int pass_end(struct rmoe_layer *L, struct rmoe_pass *pass, int rc, const char *what)
{
	if (rc == RMOE_EPEER || pass->agreed)
		return rc;
	if (!rc && pass->oversized)
		rc = rmoe_error(RMOE_ENOTSUP,
		                "the %s needs a buffer of %lld elements, more than a StarPU 1.3 vector holds "
		                "(4294967295, a uint32_t): a smaller chunk_rows or mem_cap, or more ranks, splits it",
		                pass->backward ? "backward" : "forward", (long long)pass->oversized);
	if (!rc)
		rc = rmoe_task_status_check(L->tasks);
	return rmoe_agree_first(pass->wait, L->ctx->comm, rc, what);
}

/* The memory node of a _raw call's buffers into *node: 0, or an error
 * (reported). */
static int raw_node(const struct rmoe_layer *L, enum rmoe_memory where, const char *call, int *node)
{
	*node = STARPU_MAIN_RAM;
	if (where == RMOE_MEMORY_HOST)
		return 0;
	if (where != RMOE_MEMORY_DEVICE)
		return rmoe_error(RMOE_EINVAL, "%s: where = %d: expected RMOE_MEMORY_HOST or RMOE_MEMORY_DEVICE", call,
		                  (int)where);
	if ((*node = rmoe_ctx_device_node(L->ctx)) < 0)
		return rmoe_error(RMOE_ENOTSUP, "%s: RMOE_MEMORY_DEVICE but rank %d has no CUDA worker", call,
		                  L->ctx->rank);
	if (L->cfg.check_finite)
		return rmoe_error(RMOE_ENOTSUP, "%s: check_finite reads the buffers on the host; it does not take "
		                  "device buffers", call);
	return 0;
}

/* ---- the passes ---------------------------------------------------------------------------- */

/* The planned dispatch graph of a pass: dy NULL for the forward (out = y),
 * the output gradient for the backward (out = dx). Counts the host waits
 * it makes while submitting. */
static int dispatch(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy, starpu_data_handle_t out)
{
	int64_t waits = pass->wait->count;
	int rc = dy ? L->ops->backward(L, pass, dy, out) : L->ops->forward(L, pass, out);
	pass->host_waits = (int)(pass->wait->count - waits);
	return rc;
}

/* §3.3: the forward keeps x (a copy: the caller may reuse its buffer) and
 * the routing; nothing else survives to the backward. A raw x is copied by
 * a task where it lives (on a device, device to device). */
static int keep_x(struct rmoe_layer *L, int raw, const void *x, int node)
{
	if (L->T == 0)
		return 0;
	if (!raw)
		return rmoe_write_elements(L->h_x, L->x_saved, x, L->T * L->H, L->act);
	starpu_data_handle_t h = rmoe_node_vector(NULL, node, (void *)x, L->T * L->H, L->act);
	int ret = starpu_data_cpy(L->h_x, h, 1, NULL, NULL);
	starpu_data_unregister_submit(h);
	return ret ? rmoe_error(RMOE_ESTARPU, "starpu_data_cpy of x failed (%d)", ret) : 0;
}

/* x, y: the float32 call's arrays, or (raw) buffers in the layer's element
 * type on memory node node. rc: the caller's checks (agreed on first). */
static int forward(rmoe_layer *L, int raw, const void *x, void *y, int node, int rc)
{
	const char *call = raw ? "rmoe_layer_forward_raw" : "rmoe_layer_forward";
	struct rmoe_wait w = rmoe_wait_make(L->cfg.wait_timeout);
	if (!rc && L->next_T > 0 && (!x || !y))
		rc = rmoe_error(RMOE_EINVAL, "%s: x and y must not be NULL (%lld tokens)", call, (long long)L->next_T);
	else if (!rc && L->Fs > 0 && !L->have_shared_weights)
		rc = rmoe_error(RMOE_ESTATE, "shared_ffn = %lld but no shared expert weights were set "
		                "(rmoe_layer_set_shared)", (long long)L->Fs);
	else if (!rc && L->Fs > 0 && L->cfg.shared_gated && !L->have_shared_gate)
		rc = rmoe_error(RMOE_ESTATE, "shared_gated = 1 but no shared expert gate was set "
		                "(rmoe_layer_set_shared_expert_gate)");
	else if (!rc && L->cfg.check_finite && !raw)
		rc = rmoe_layer_find_nonfinite(L, &w, x, NULL, NULL, 1);
	double t0;
	struct rmoe_pass pass = {.wait = &w};
	if ((rc = pass_begin(L, &pass, rc, "the forward's checks", &t0)))
		return rmoe_pass_peer_named(L, &pass, rc);
	if ((rc = keep_x(L, raw, x, node)))
		return rc;
	struct edge ey;
	struct measure m;
	rc = edge_open(L, &pass, &ey, raw ? NULL : y, raw ? y : NULL, node, L->T * L->H, L->act, 0);
	measure_start(&m);
	if (!rc)
		rc = submit_router_fwd(L);
	if (!rc && L->Fs > 0 && L->T > 0)
		rc = submit_shared_fwd(L, &pass, ey.h);
	/* The shared expert runs alone, before the dispatch posts its first
	 * receives: its buffers and the relay's never coexist, so the peak is
	 * the larger of the two phases, whatever the timing (memory_model.c). */
	if (!rc && L->Fs > 0)
		rc = rmoe_wait_tasks(pass.wait, "the shared expert");
	if (!rc)
		rc = read_counts(L, &pass);
	if (!rc)
		rc = dispatch(L, &pass, NULL, ey.h);
	/* After RMOE_EPEER tasks may still hold y: nothing more is waited for. */
	if (rc != RMOE_EPEER && ey.h) {
		int frc = rmoe_pass_finish(L, &pass, &ey.h, 1);
		if (frc == RMOE_EPEER) {
			measure_stop(&m);
			return rmoe_pass_peer_named(L, &pass, frc);
		}
		rc = rc ? rc : frc;
	}
	/* y is written back only when every rank's tasks succeeded. */
	rc = pass_end(L, &pass, rc, "the forward's tasks");
	if (rc != RMOE_EPEER)
		edge_close(&ey, !rc);
	if (rc) {
		measure_stop(&m);
		return rmoe_pass_peer_named(L, &pass, rc);
	}
	L->have_forward = 1;
	record(L, &pass, &m, t0);
	return 0;
}

int rmoe_layer_forward(rmoe_layer *L, const float *x, float *y)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_forward: layer must not be NULL");
	return forward(L, 0, x, y, STARPU_MAIN_RAM, 0);
}

int rmoe_layer_forward_raw(rmoe_layer *L, enum rmoe_memory where, const void *x, void *y)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_forward_raw: layer must not be NULL");
	int node;
	int rc = raw_node(L, where, "rmoe_layer_forward_raw", &node);
	return forward(L, 1, x, y, node, rc);
}

int rmoe_layer_backward(rmoe_layer *L, const float *dy, float *dx)
{
	return rmoe_layer_backward_ex(L, dy, NULL, dx);
}

/* dy, dx: the float32 call's arrays, or (raw) buffers in the layer's
 * element type on memory node node, dprobs (float32, may be NULL) with them. */
static int backward(rmoe_layer *L, int raw, const void *dy, const float *dprobs, void *dx, int node, int rc)
{
	const char *call = raw ? "rmoe_layer_backward_raw" : "rmoe_layer_backward";
	struct rmoe_wait w = rmoe_wait_make(L->cfg.wait_timeout);
	if (!rc && L->T > 0 && (!dy || !dx))
		rc = rmoe_error(RMOE_EINVAL, "%s: dy and dx must not be NULL (%lld tokens)", call, (long long)L->T);
	else if (!rc && !L->have_forward)
		rc = rmoe_error(RMOE_ESTATE, "%s called before any rmoe_layer_forward", call);
	else if (!rc && L->cfg.check_finite && !raw)
		rc = rmoe_layer_find_nonfinite(L, &w, NULL, dy, dprobs, 0);
	double t0;
	struct rmoe_pass pass = {.backward = 1, .wait = &w};
	if ((rc = pass_begin(L, &pass, rc, "the backward's checks", &t0)))
		return rmoe_pass_peer_named(L, &pass, rc);
	struct edge edx = {0}, edy = {0}, edp = {0};
	struct measure m;
	rc = edge_open(L, &pass, &edx, raw ? NULL : dx, raw ? dx : NULL, node, L->T * L->H, L->act, 0);
	if (!rc)
		rc = edge_open(L, &pass, &edy, raw ? NULL : (float *)dy, raw ? (void *)dy : NULL, node, L->T * L->H, L->act, 1);
	if (!rc && dprobs)
		rc = edge_open(L, &pass, &edp, raw ? NULL : (float *)dprobs, raw ? (void *)dprobs : NULL, node, L->T * L->E,
		               sizeof(float), 1);
	measure_start(&m);
	if (!rc && L->Fs > 0 && L->T > 0)
		rc = submit_shared_bwd(L, &pass, edy.h, edx.h);
	/* As forward: the shared expert's phase, then the dispatch's. */
	if (!rc && L->Fs > 0)
		rc = rmoe_wait_tasks(pass.wait, "the shared expert");
	if (!rc)
		rc = dispatch(L, &pass, edy.h, edx.h);
	if (!rc)
		rc = submit_router_bwd(L, edx.h, edp.h);
	starpu_data_handle_t outs[] = {edx.h, L->h_dw_part, L->h_dw_router, L->h_dws, L->h_dw_sgate};
	/* After RMOE_EPEER tasks may still hold dy and dx: nothing more is waited for. */
	if (rc != RMOE_EPEER) {
		int frc = rmoe_pass_finish(L, &pass, outs, L->h_dw_sgate ? 5 : 4);
		if (frc == RMOE_EPEER) {
			measure_stop(&m);
			return rmoe_pass_peer_named(L, &pass, frc);
		}
		/* dx is written back only when every rank's tasks succeeded. */
		rc = pass_end(L, &pass, rc ? rc : frc, "the backward's tasks");
		edge_close(&edx, !rc);
		edge_close(&edy, 0);
		edge_close(&edp, 0);
	}
	if (rc) {
		measure_stop(&m);
		return rmoe_pass_peer_named(L, &pass, rc);
	}
	record(L, &pass, &m, t0);
	return 0;
}

int rmoe_layer_backward_ex(rmoe_layer *L, const float *dy, const float *dprobs, float *dx)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_backward: layer must not be NULL");
	return backward(L, 0, dy, dprobs, dx, STARPU_MAIN_RAM, 0);
}

int rmoe_layer_backward_raw(rmoe_layer *L, enum rmoe_memory where, const void *dy, const float *dprobs, void *dx)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_backward_raw: layer must not be NULL");
	int node;
	int rc = raw_node(L, where, "rmoe_layer_backward_raw", &node);
	return backward(L, 1, dy, dprobs, dx, node, rc);
}
