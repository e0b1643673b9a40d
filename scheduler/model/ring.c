/* The rings' memory models (§3.1 expert routing, §3.2 token routing):
 * their receive slots and one hop's (or chunk's) rows at a time.
 * memory_model.c's head comment names the buffers and the terms. */
#include "rmoe_model_terms.h"

/* Expert routing: the weight relay, and in the backward the gradient relay. */
int rmoe_model_ring_expert(const struct rmoe_model_terms *t, struct rmoe_model_phase *p, struct rmoe_mem_estimate *o)
{
	const int64_t N = t->N, W = t->W, s = t->s, r = t->r, H = t->H, F = t->F, window = t->window;
	const int64_t shared = t->shared, shared_b = t->shared_b;
	int64_t fwd, bwd, largest = p->largest;
	/* Receive buffers: hops 1..N-1 arrive in window slots, so
	 * min(window, N-1) of them are ever used (two by default, one with
	 * two ranks). Backward adds the gradient relay, whose slots also
	 * serve hop 0 (min(window, N): by default the accumulator being
	 * summed and the one still leaving for the right), and one partial
	 * gradient (window.c's gate). */
	int64_t rbufs = N > 1 ? (window < N - 1 ? window : N - 1) : 0;
	int64_t gbufs = N > 1 ? (window < N ? window : N) : 0;
	int64_t relay_f = rbufs * W * s;
	int64_t relay_b = N > 1 ? (rbufs + gbufs + 1) * W * s : 0;
	/* Striped crossing hops (graph/pass/stripes.c): a rank relays pieces
	 * of W*s/S bytes, in window slots per relayed kind, as an out relay
	 * (of its node's crossing edge out) and an in relay (of the one in);
	 * with S = 2 each rank is one of them, from 3 on some are both. The
	 * relayed kinds: forward the weights (hops 1..N-1, rbufs slots);
	 * backward the weights, the accumulators (rbufs each) and the
	 * gradients' return (one). */
	const int64_t S = t->c->stripes > 1 && N > 1 ? t->c->stripes : 1;
	const int64_t roles = S > 2 ? 2 : S - 1, piece = (W * s + S - 1) / S;
	relay_f += roles * rbufs * piece;
	relay_b += roles * (2 * rbufs + 1) * piece;
	fwd = rmoe_max2(shared, relay_f + r * (2 * H + 3 * F) * s);
	bwd = rmoe_max2(shared_b, relay_b + r * (2 * H + 4 * F) * s);
	o->fixed_backward = o->resident_backward + relay_b;
	o->per_row_backward = (2 * H + 4 * F) * s;
	largest = rmoe_max2(largest, rmoe_max2(N > 1 ? W * s : 0, r * rmoe_max2(H, 4 * F) * s));
	return rmoe_model_done(p, fwd, bwd, largest);
}

/* Token routing: the travelling activations, routing and accumulators. */
int rmoe_model_ring_token(const struct rmoe_model_terms *t, struct rmoe_model_phase *p, struct rmoe_mem_estimate *o)
{
	const int64_t N = t->N, T = t->Tm, P = t->Tm * t->K, s = t->s, r = t->rm, H = t->H, F = t->F;
	const int64_t window = t->window, shared = t->shared, shared_b = t->shared_b;
	int64_t fwd, bwd, largest = p->largest;
	/* One set of travelling buffers with two ranks, two otherwise; from
	 * hop 1 on a hop computes into partials (forward: outputs [T,H];
	 * backward: dx [T,H] and dg [T,K]) added into the visiting
	 * accumulators once they arrive. Every partition travels with the
	 * call's largest count (T here); a rank with fewer tokens pads its own
	 * to it, a copy of each kind it sends: the accumulators' live to the
	 * end, the inputs' until they have left at hop 0, which the network
	 * may have done before the peak (later hops'): they are the rows
	 * leaving, as a2a's. */
	int64_t sets = N > 1 ? (window < N - 1 ? window : N - 1) : 0;
	const int padded = N > 1 && t->T < T;
	const int64_t in_f = padded ? T * H * s + 2 * P * 4 : 0, in_b = padded ? 2 * T * H * s + 2 * P * 4 : 0;
	int64_t travel_f = sets * (2 * T * H * s + 2 * P * 4) + (padded ? T * H * s : 0) + in_f;
	int64_t travel_b = sets * (3 * T * H * s + 3 * P * 4) + (padded ? T * H * s + P * 4 : 0) + in_b;
	int64_t part_f = N > 1 ? T * H * s : 0, part_b = N > 1 ? T * H * s + P * 4 : 0;
	/* Striped crossing hops: the relays' pieces, as expert routing's, of
	 * every kind a set carries (sets slots each) and of the accumulators'
	 * return (forward y; backward dx and dg). */
	const int64_t S = t->c->stripes > 1 && N > 1 ? t->c->stripes : 1, roles = S > 2 ? 2 : S - 1;
	travel_f += roles * ((sets * (2 * T * H * s + 2 * P * 4) + T * H * s + S - 1) / S);
	travel_b += roles * ((sets * (3 * T * H * s + 3 * P * 4) + T * H * s + P * 4 + S - 1) / S);
	fwd = rmoe_max2(shared, travel_f + part_f + r * (2 * H + 3 * F) * s);
	bwd = rmoe_max2(shared_b, travel_b + part_b + r * (2 * H + 4 * F) * s);
	o->leaving_forward = fwd > shared ? in_f : 0;
	o->leaving_backward = bwd > shared_b ? in_b : 0;
	o->fixed_backward = o->resident_backward + travel_b + part_b;
	o->per_row_backward = (2 * H + 4 * F) * s;
	largest = rmoe_max2(largest, r * rmoe_max2(H, 4 * F) * s);
	return rmoe_model_done(p, fwd, bwd, largest);
}
