/* The memory model of the dispatchers, buffer by buffer.
 *
 * Notation (one rank): T tokens, P = T*K pairs, N ranks, W the floats of one
 * partition's weights (E/N experts of 3*H*F/ETP), r the rows of the busiest
 * hop or of a2a's busiest exchanged block (skew * P/N, or the chunk size), M
 * the rows the busiest rank's experts compute in a2a-megatron (skew * P). s is the element size of activations
 * and weights; routing (indices, weights, probabilities) stays 4-byte.
 *
 * Resident, every dispatcher (graph/layer.c, forward_backward.c): router and its gradient (H*E),
 * the owned partition and its gradient (2W), the shared expert and its
 * gradient, the saved x (T*H), probabilities (T*E), routing weights and dg
 * (2P), top-k indices and pair order (2P int32), expert counts (E int32);
 * plus the caller's y (forward) or dy and dx (backward). The kept [T, *]
 * buffers have room for the capacity C >= T (Tc below), the caller's for T.
 *
 * Temporaries (StarPU-allocated, the graphs in graph/):
 * - ring expert routing: min(window, N-1) weight receive buffers (window 2
 *   by default: two, one with two ranks), backward also min(window, N)
 *   gradient relay buffers and one partial gradient (the
 *   gate of window.c); one hop's rows at a time (the window of window.c):
 *   forward gathered x, work [r,3F], out [r,H]; backward gathered x (consumed
 *   into dx), gathered dy, work [r,4F].
 * - ring token routing: min(window, N-1) of each travelling buffer (x, routing, the
 *   output accumulator; backward also dy, dx and dg), the same hop rows, and
 *   one partial of the accumulators (the gate of window.c), all for the
 *   call's largest count Tm; a rank with fewer tokens also holds its own
 *   partition padded to Tm (x, routing and y; backward also dy, dx, dg).
 * - a2a: chunks of at most a hop's rows pipelined per peer, a bounded
 *   number in flight (rmoe_a2a_depth per role; none received before its
 *   receive is posted, the receivers' credits), the ring's pair-weighted
 *   kernel in the backward (2H + 4F per row); for a known routing
 *   (c->blocks) each rank's own blocks, else the busiest in both roles.
 * - a2a-megatron (Megatron Core 0.13's alltoall dispatcher): the stages of
 *   graph/dispatch/alltoall_megatron.c, all T*K rows at once, ordered as collectives
 *   on a stream.
 * - a2a-deepep (DeepEP's normal mode, graph/dispatch/alltoall_deepep.c): a2a's
 *   pipeline of whole blocks, a block's tokens sent once (D of them for its
 *   r pairs) and expanded to the pairs on the experts' rank; its buffers
 *   per block below (deepep_blocks).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_memory_model.h"
#include "rmoe_model_terms.h"
#include "rmoe_scheduler.h"

void rmoe_mem_config_init(struct rmoe_mem_config *c)
{
	memset(c, 0, sizeof(*c));
	c->nranks = 1;
	c->etp = 1;
	c->dtype_bytes = 4;
	c->skew = 1.0;
}

void rmoe_mem_config_from_layer(struct rmoe_mem_config *c, const struct rmoe_layer_config *cfg,
                                int nranks)
{
	rmoe_mem_config_init(c);
	c->tokens = cfg->tokens;
	c->hidden = cfg->hidden;
	c->ffn = cfg->ffn;
	c->experts = cfg->experts;
	c->topk = cfg->topk;
	c->nranks = nranks;
	c->shared_ffn = cfg->shared_ffn;
	c->shared_gated = cfg->shared_gated;
	c->chunk_rows = cfg->chunk_rows;
	c->partitions = cfg->partitions;
	c->window = cfg->window;
	c->capped = cfg->mem_cap > 0;
	c->dtype_bytes = cfg->dtype == RMOE_DTYPE_BF16 ? 2 : 4;
}

static int check(const struct rmoe_mem_config *c)
{
	const struct {
		const char *name;
		int64_t v;
	} pos[] = {{"tokens", c->tokens > 0 || c->rank_tokens ? 1 : 0}, {"hidden", c->hidden}, {"ffn", c->ffn},
	           {"experts", c->experts}, {"topk", c->topk}, {"nranks", c->nranks},
	           {"etp", c->etp}};
	for (unsigned i = 0; i < sizeof(pos) / sizeof(pos[0]); i++)
		if (pos[i].v <= 0)
			return rmoe_error(RMOE_EINVAL, "memory model: %s = %lld, expected a positive integer",
			                  pos[i].name, (long long)pos[i].v);
	if (c->experts % c->nranks)
		return rmoe_error(RMOE_EINVAL, "memory model: experts = %lld not divisible by %lld ranks",
		                  (long long)c->experts, (long long)c->nranks);
	if (c->dtype_bytes != 2 && c->dtype_bytes != 4)
		return rmoe_error(RMOE_EINVAL, "memory model: dtype_bytes = %d, expected 2 or 4", c->dtype_bytes);
	const int64_t parts = c->partitions > 1 ? c->partitions : 1;
	if (!(c->skew >= 1.0) || c->skew > (double)(c->nranks * parts))
		return rmoe_error(RMOE_EINVAL, "memory model: skew = %g, expected 1 <= skew <= %lld partitions",
		                  c->skew, (long long)(c->nranks * parts));
	if (c->window < 0 || c->window == 1)
		return rmoe_error(RMOE_EINVAL, "memory model: window = %lld, expected 0 (default) or at least 2",
		                  (long long)c->window);
	for (int64_t r = 0; c->rank_tokens && r < c->nranks; r++)
		if (c->rank_tokens[r] < 0)
			return rmoe_error(RMOE_EINVAL, "memory model: rank_tokens[%lld] = %lld, expected 0 or more",
			                  (long long)r, (long long)c->rank_tokens[r]);
	if (c->capacity < 0)
		return rmoe_error(RMOE_EINVAL, "memory model: capacity = %lld, expected 0 or more", (long long)c->capacity);
	if (c->chunk_rows < 0 || c->shared_ffn < 0 || c->partitions < 0)
		return rmoe_error(RMOE_EINVAL, "memory model: chunk_rows, shared_ffn and partitions must not be negative");
	return 0;
}

/* The rows of a hop (or chunk) of a partition of P pairs. */
static int64_t hop_rows(const struct rmoe_mem_config *c, int64_t P)
{
	const int64_t parts = c->partitions > 1 ? c->partitions : 1;
	int64_t r = (int64_t)ceil(c->skew * (double)P / (double)(c->nranks * parts));
	if (c->nranks * parts == 1)
		r = P;
	if (c->chunk_rows > 0 && r > c->chunk_rows)
		r = c->chunk_rows;
	return r;
}

/* The terms of c every dispatcher's model is written in, for a rank of T
 * tokens in a call whose largest count is Tm. */
static struct rmoe_model_terms terms(const struct rmoe_mem_config *c, int64_t T, int64_t Tm)
{
	struct rmoe_model_terms t = {.c = c};
	t.Tm = Tm;
	t.Tc = rmoe_max2(c->capacity, Tm);
	t.T = T, t.H = c->hidden, t.F = c->ffn / c->etp, t.E = c->experts, t.K = c->topk;
	t.N = c->nranks, t.s = c->dtype_bytes, t.Fs = c->shared_ffn, t.P = t.T * t.K;
	t.W = t.E / t.N * 3 * t.H * t.F, t.even = (t.P + t.N - 1) / t.N;
	/* A hop's rows: the pairs of the busiest partition (of N*parts), of
	 * this rank's tokens and of the largest partition's. */
	t.r = hop_rows(c, t.P);
	t.rm = hop_rows(c, Tm * t.K);
	/* The rows a rank's experts compute: the skew over the mean of the
	 * ranks' pairs (with equal counts, a rank's own). */
	double mean = (double)t.P;
	if (c->rank_tokens) {
		mean = 0;
		for (int64_t r = 0; r < c->nranks; r++)
			mean += (double)(c->rank_tokens[r] * t.K) / (double)c->nranks;
	}
	t.M = (int64_t)ceil(c->skew * mean);
	/* Ring slots per relayed kind (graph/pass/flow.c): hop h is received
	 * into slot h mod window, and a neighbour sends it only once the slot
	 * is free, so no message waits outside them. */
	t.window = c->window > 0 ? c->window : RMOE_WINDOW_DEFAULT;
	/* The shared expert runs first, alone (forward_backward.c waits for it
	 * before the dispatch posts anything): work [T,3Fs], out or dx [T,H];
	 * gated, the backward recomputes the output too (the gate's gradient
	 * reads it), then turns it into the gated dy. Its phase and the
	 * dispatch's never overlap: the peak is the larger. */
	t.shared = t.Fs > 0 ? t.T * (3 * t.Fs + t.H) * t.s : 0;
	t.shared_b = t.shared + (t.Fs > 0 && c->shared_gated ? t.T * t.H * t.s : 0);
	return t;
}

/* What every dispatcher holds throughout a pass into o: the router, the
 * weights, the saved input and the routing, with the caller's buffers. */
static void resident(const struct rmoe_dispatcher *row, const struct rmoe_model_terms *t,
                     struct rmoe_mem_estimate *o)
{
	const int64_t T = t->T, H = t->H, E = t->E, N = t->N, s = t->s, Fs = t->Fs, W = t->W;
	/* The kept buffers for the capacity, the caller's for the call. */
	const int64_t Tc = t->Tc, Pc = Tc * t->K;
	/* The router and the gated shared expert's gate [H] (Qwen2-MoE), with
	 * their gradients, are 4-byte. */
	const int64_t gate = Fs > 0 && t->c->shared_gated ? 4 * H : 0;
	/* A dispatcher that counts each peer's tokens keeps them beside the
	 * expert counts (E + N). */
	const int64_t routing = 4 * (H * E * 2 + Tc * E + 2 * Pc) + 4 * (2 * Pc + E) + 2 * gate +
	                        (row->peer_counts ? 4 * (E + N) : 0);
	const int64_t weights = 2 * W * s + (Fs > 0 ? 6 * H * Fs * s : 0);
	const int64_t all = routing + weights + Tc * H * s;
	o->resident_forward = all + T * H * s;
	o->resident_backward = all + 2 * T * H * s;
	o->weights_and_inputs = 4 * H * E + gate + W * s + (Fs > 0 ? 3 * H * Fs * s : 0) + T * H * s;
}

/* Bytes of the structures s counts, n of them. */
static int64_t structs_bytes(const struct rmoe_runtime_units *u, const struct rmoe_chunk_structs *s, int64_t n)
{
	return (int64_t)ceil((double)n * (s->handles * (double)u->handle + s->tasks * (double)u->task +
	                                  s->task_buffers * (double)u->task_buffer + s->arg_bytes +
	                                  s->sends * (double)u->send + s->recvs * (double)u->recv));
}

/* The runtime's structures of a pass (rmoe_mem_estimate.runtime_*): a
 * chunk's per chunk, the chunks being every hop's rows cut at the chunk
 * rows (at most rows / chunk + hops of them whatever the routing), and
 * per hop or peer as many as a chunk's again (its transfers, partials and
 * fences: the ring's backward, counted at 4 ranks, holds 2.5 handles, 1.5
 * tasks, 2.5 sends and 2.5 receives a hop, some 23 KB against a chunk's
 * 19 KB; the estimate came 0.5% under the counted figure with one). */
static void runtime_terms(const struct rmoe_dispatcher *row, const struct rmoe_model_terms *t,
                          struct rmoe_mem_estimate *o)
{
	const struct rmoe_mem_config *c = t->c;
	const struct rmoe_runtime_units *u = &c->runtime;
	if (!u->handle && !u->task)
		return;
	const int64_t parts = c->partitions > 1 ? c->partitions : 1, hops = t->N * parts;
	const int64_t computed = rmoe_max2(t->M, t->Tm * t->K);
	const int64_t rows = row->chunk_rows_of == RMOE_CHUNKS_OWN ? t->P
	                     : row->chunk_rows_of == RMOE_CHUNKS_COMPUTED ? computed
	                                                                 : rmoe_max2(t->P, computed);
	const int64_t chunks = (c->chunk_rows > 0 ? (rows + c->chunk_rows - 1) / c->chunk_rows : 0) + 2 * hops;
	o->runtime_forward = structs_bytes(u, &row->runtime_fwd, chunks);
	o->runtime_backward = structs_bytes(u, &row->runtime_bwd, chunks);
}

/* One rank's estimate: T tokens in a call whose largest count is Tm. */
static int model_rank(const struct rmoe_dispatcher *row, const struct rmoe_mem_config *c, int64_t T, int64_t Tm,
                      struct rmoe_mem_estimate *o)
{
	int rc;
	memset(o, 0, sizeof(*o));
	const struct rmoe_model_terms t = terms(c, T, Tm);
	resident(row, &t, o);
	struct rmoe_model_phase p = {0, 0, rmoe_max2(t.Fs > 0 ? t.T * 3 * t.Fs * t.s : 0, t.T * t.H * t.s)};
	if ((rc = row->model(&t, &p, o)))
		return rc;
	/* where the shared expert's phase sets the peak, nothing is leaving */
	if (p.fwd == t.shared)
		o->leaving_forward = 0;
	if (p.bwd == t.shared || p.bwd == t.shared_b)
		o->leaving_backward = 0;
	o->dynamic_forward = p.fwd;
	o->dynamic_backward = p.bwd;
	o->peak_forward = o->resident_forward + p.fwd;
	o->peak_backward = o->resident_backward + p.bwd;
	o->peak = rmoe_max2(o->peak_forward, o->peak_backward);
	o->largest_buffer = p.largest;
	runtime_terms(row, &t, o);
	return 0;
}

int rmoe_memory_model(enum rmoe_dispatch d, const struct rmoe_mem_config *c,
                      struct rmoe_mem_estimate *o)
{
	int rc = check(c);
	if (rc)
		return rc;
	const struct rmoe_dispatcher *row = rmoe_dispatcher_of(d);
	if (!row || !row->model)
		return rmoe_error(RMOE_EINVAL, "memory model: dispatch %d has no model", (int)d);
	if (!c->rank_tokens)
		return model_rank(row, c, c->tokens, c->tokens, o);
	/* Every rank with its own count: the most any of them holds, pass by
	 * pass (the forward's and the backward's peaks may be different
	 * ranks'), the other figures those of the rank with the largest. */
	int64_t Tm = 0;
	for (int64_t r = 0; r < c->nranks; r++)
		Tm = rmoe_max2(Tm, c->rank_tokens[r]);
	int64_t fwd = 0, bwd = 0;
	for (int64_t r = 0; r < c->nranks && !rc; r++) {
		struct rmoe_mem_estimate e;
		if ((rc = model_rank(row, c, c->rank_tokens[r], Tm, &e)))
			break;
		if (r == 0 || e.peak > o->peak)
			*o = e;
		fwd = rmoe_max2(fwd, e.peak_forward);
		bwd = rmoe_max2(bwd, e.peak_backward);
	}
	o->peak_forward = fwd;
	o->peak_backward = bwd;
	return rc;
}

/* What a cap must hold at chunks of rows rows: the data's peak and the
 * runtime's structures beside it, the larger pass. */
static int64_t capped_total(enum rmoe_dispatch d, const struct rmoe_mem_config *one, int64_t rows,
                            struct rmoe_mem_estimate *e)
{
	struct rmoe_mem_config t = *one;
	t.chunk_rows = rows;
	if (rmoe_memory_model(d, &t, e))
		return INT64_MAX;
	return rmoe_max2(e->peak_forward + e->runtime_forward, e->peak_backward + e->runtime_backward);
}

int rmoe_memory_cap_chunk(enum rmoe_dispatch d, const struct rmoe_mem_config *c, int64_t cap,
                          int64_t *chunk_rows)
{
	const struct rmoe_dispatcher *row = rmoe_dispatcher_of(d);
	if (row && !row->capped)
		return rmoe_error(RMOE_ENOTSUP, "a memory cap applies to the ring dispatchers and a2a; %s %s", row->name,
		                  row->no_cap);
	/* The chunks are planned against the cap less 1/RMOE_CAP_HEADROOM of
	 * it: the model orders the buffers as the graphs submit them, but a
	 * small one (routing of a visiting partition) may outlive its turn
	 * when the machine is loaded; 4 ranks of token routing were once
	 * measured 0.36% above an exactly planned cap. And the heap holds more
	 * than the runtime's structures counted (the allocator's slack, StarPU's
	 * lists): 4 ranks of ring with chunks of 735 rows were measured 0.6%
	 * above a cap planned with 1/64 of it left. */
	const int64_t budget = cap - cap / RMOE_CAP_HEADROOM;
	struct rmoe_mem_config one = *c;
	one.capped = 1;
	struct rmoe_mem_estimate e;
	int rc = rmoe_memory_model(d, &one, &e);
	if (rc)
		return rc;
	/* The data grows with the chunk rows, the runtime's structures shrink
	 * with them (a chunk's handles and tasks, some 20 KB): the smallest
	 * total lies between, where the two are about even. Its chunk, found
	 * by a search over the rows (the total falls, then rises), is the
	 * least the cap must hold; larger chunks fit up to the budget. */
	int64_t lo = 1, hi = c->tokens * c->topk;
	if (hi < 1)
		hi = 1;
	while (hi - lo > 2) {
		const int64_t m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
		if (capped_total(d, &one, m1, &e) <= capped_total(d, &one, m2, &e))
			hi = m2;
		else
			lo = m1;
	}
	int64_t best = lo, least = capped_total(d, &one, lo, &e);
	for (int64_t r = lo + 1; r <= hi; r++) {
		const int64_t total = capped_total(d, &one, r, &e);
		if (total < least)
			best = r, least = total;
	}
	if (least > budget) {
		capped_total(d, &one, best, &e);   /* e at the leanest chunk, for the message */
		return rmoe_error(RMOE_EINVAL,
		                  "memory cap %lld bytes is too small: the layer holds %lld bytes before a hop's "
		                  "rows (weights, gradients, inputs, routing, ring buffers), and at its leanest, "
		                  "chunks of %lld rows, %lld bytes in all with the runtime's structures (%lld); "
		                  "expected a cap of at least %lld (with %.1f%% headroom)",
		                  (long long)cap, (long long)e.fixed_backward, (long long)best, (long long)least,
		                  (long long)rmoe_max2(e.runtime_forward, e.runtime_backward),
		                  (long long)(least + least / (RMOE_CAP_HEADROOM - 1) + 1), 100.0 / RMOE_CAP_HEADROOM);
	}
	/* Largest chunk that fits: from the leanest on, the total grows with
	 * the rows; bisect. */
	lo = best;
	hi = rmoe_max2(best, c->tokens * c->topk);
	while (lo < hi) {
		int64_t mid = lo + (hi - lo + 1) / 2;
		if (capped_total(d, &one, mid, &e) <= budget)
			lo = mid;
		else
			hi = mid - 1;
	}
	*chunk_rows = lo;
	return 0;
}

int64_t rmoe_memory_max_tokens(enum rmoe_dispatch d, const struct rmoe_mem_config *c, int64_t budget)
{
	struct rmoe_mem_config t = *c;
	struct rmoe_mem_estimate e;
	t.tokens = 1;
	if (rmoe_memory_model(d, &t, &e) || e.peak > budget)
		return 0;
	int64_t lo = 1, hi = 1;
	/* grow, then bisect: the peak is monotone in the tokens */
	while (hi < ((int64_t)1 << 40)) {
		t.tokens = hi * 2;
		if (rmoe_memory_model(d, &t, &e) || e.peak > budget)
			break;
		hi *= 2;
	}
	lo = hi;
	hi = hi * 2;
	while (lo < hi - 1) {
		int64_t mid = lo + (hi - lo) / 2;
		t.tokens = mid;
		if (!rmoe_memory_model(d, &t, &e) && e.peak <= budget)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}
