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
 * plus the caller's y (forward) or dy and dx (backward).
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
 *   one partial of the accumulators (the gate of window.c).
 * - a2a: chunks of at most a hop's rows pipelined per peer, a bounded
 *   number in flight (RMOE_A2A_DEPTH per role; none received before its
 *   receive is posted, the receivers' credits), the ring's pair-weighted
 *   kernel in the backward (2H + 4F per row); for a known routing
 *   (c->blocks) each rank's own blocks, else the busiest in both roles.
 * - a2a-megatron (Megatron Core 0.13's alltoall dispatcher): the stages of
 *   graph/alltoall_megatron.c, all T*K rows at once, ordered as collectives
 *   on a stream.
 * - a2a-deepep (DeepEP's normal mode, graph/alltoall_deepep.c): a2a's
 *   pipeline of whole blocks, a block's tokens sent once (D of them for its
 *   r pairs) and expanded to the pairs on the experts' rank; its buffers
 *   per block below (deepep_blocks).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_memory_model.h"
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
	c->window = rmoe_config_window(cfg);
	c->dtype_bytes = cfg->dtype == RMOE_DTYPE_BF16 ? 2 : 4;
}

static int64_t max2(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

static int check(const struct rmoe_mem_config *c)
{
	const struct {
		const char *name;
		int64_t v;
	} pos[] = {{"tokens", c->tokens}, {"hidden", c->hidden}, {"ffn", c->ffn},
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
	if (c->chunk_rows < 0 || c->shared_ffn < 0 || c->partitions < 0)
		return rmoe_error(RMOE_EINVAL, "memory model: chunk_rows, shared_ffn and partitions must not be negative");
	return 0;
}

/* a2a's temporaries for a known routing (c->blocks), whole blocks: rank q
 * computes its own block, then those of q-1, q-2, ... and sends to q+1,
 * q+2, ...; at most RMOE_A2A_DEPTH consecutive blocks of each role are
 * alive at once (alltoall_fwd.c), one of its expert blocks computing (comp
 * bytes a row), the others received or waiting to go back (held), each
 * token block tok. Both roles' largest windows, summed, plus the
 * backward's identity pair order of the largest received block (ident
 * bytes a row); the largest over the ranks. Of a token block's bytes,
 * leave a row are its inputs, which may have left: *leaving, of the
 * largest rank's. */
static int64_t a2a_blocks(const struct rmoe_mem_config *c, int64_t comp, int64_t held, int64_t tok, int64_t ident,
                          int64_t leave, int64_t *leaving)
{
	const int64_t N = c->nranks, D = RMOE_A2A_DEPTH;
	const int64_t *b = c->blocks;
	int64_t worst = 0;
	for (int64_t q = 0; q < N; q++) {
		int64_t exp = 0, out = 0, largest = 0, rows_out = 0;
		for (int64_t w = 0; w == 0 || w + D <= N; w++) {
			int64_t sum = 0, top = 0;
			for (int64_t k = w; k < w + D && k < N; k++) {
				const int64_t rows = b[((q - k + N) % N) * N + q];
				sum += rows * held;
				top = max2(top, rows * (comp - held));
			}
			exp = max2(exp, sum + top);
		}
		for (int64_t w = 1; w == 1 || w + D <= N; w++) {
			int64_t sum = 0, rows = 0;
			for (int64_t k = w; k < w + D && k < N; k++)
				rows += b[q * N + (q + k) % N];
			sum = rows * tok;
			if (sum > out) {
				out = sum;
				rows_out = rows;
			}
		}
		for (int64_t s = 0; s < N; s++)
			largest = max2(largest, b[s * N + q]);
		if (exp + out + largest * ident > worst) {
			worst = exp + out + largest * ident;
			*leaving = rows_out * leave;
		}
	}
	return worst;
}

double rmoe_uniform_tokens_per_pair(int64_t topk, int64_t experts, int64_t el)
{
	/* A uniform router picks K distinct experts of E: a token meets a rank
	 * of el experts with probability 1 - C(E-el, K)/C(E, K), against K*el/E
	 * pairs expected there. */
	double miss = 1.0;
	for (int64_t i = 0; i < topk; i++)
		miss *= (double)(experts - el - i) / (double)(experts - i);
	if (miss < 0)
		miss = 0;
	return (1.0 - miss) / ((double)topk * (double)el / (double)experts);
}

int64_t rmoe_block_tokens_within(int64_t d, int64_t pairs, int64_t tokens, int64_t topk, int64_t el)
{
	const int64_t per_token = topk < el ? topk : el, lo = (pairs + per_token - 1) / per_token;
	const int64_t hi = pairs < tokens ? pairs : tokens;
	return d < lo ? lo : d > hi ? hi : d;
}

/* Distinct tokens of a block of r pairs under a uniform router (K of E
 * experts, el of them on the block's rank), rounded up. */
static int64_t uniform_tokens(int64_t T, int64_t K, int64_t E, int64_t el, int64_t r)
{
	const int64_t d = (int64_t)ceil(rmoe_uniform_tokens_per_pair(K, E, el) * (double)r);
	return rmoe_block_tokens_within(d, r, T, K, el);
}

/* a2a-deepep's temporaries (alltoall_deepep.c), whole blocks of r pairs
 * and D tokens from rank s to rank q (b, tok: [s * N + q]), the pipeline
 * of a2a_blocks: at most RMOE_A2A_DEPTH consecutive blocks of each role
 * alive, one of the expert blocks on the experts. Bytes of a block, s the
 * element size:
 *   received, or combined and waiting to go back (fwd): D (H s + 8K) (rows,
 *   codes, weights); bwd D (2 H s + 8K);
 *   on the experts: fwd r (2H + 3F) s + 8DK (expanded rows, workspace,
 *   outputs; codes, weights), bwd 12DK (codes, weights, dg) and the
 *   largest of the graph's three phases, one after the other: x expanded
 *   beside both inputs (2DH + rH) s, dy expanded beside its input and
 *   the x rows (DH + 2rH) s, the backward on both expansions and the
 *   workspace r (2H + 4F) s;
 *   a token block: fwd 4T + D (2 H s + 8K) (token list, rows, codes,
 *   weights out, combined rows back), bwd 4T + D (3 H s + 12K) (with dy
 *   out, dx and dg back); of it, the inputs may have left: D (H s + 8K),
 *   bwd D (2 H s + 8K).
 * A rank's own block is a2a's step 0 (per row own_comp), with the
 * backward's identity pair order (4 bytes a row, ident). It holds nothing
 * once off the experts: its outputs are added here before a peer's block
 * reaches them (alltoall_deepep.c, own_added_first). */
static int64_t deepep_blocks(const struct rmoe_mem_config *c, const int64_t *b, const int64_t *tok, int bwd,
                             int64_t own_comp, int64_t *leaving)
{
	const int64_t N = c->nranks, D = RMOE_A2A_DEPTH, T = c->tokens, H = c->hidden, K = c->topk;
	const int64_t F = c->ffn / c->etp, s = c->dtype_bytes;
	int64_t worst = 0;
	for (int64_t q = 0; q < N; q++) {
		int64_t exp = 0, out = 0, left = 0;
		for (int64_t w = 0; w == 0 || w + D <= N; w++) {
			int64_t sum = 0, top = 0;
			for (int64_t k = w; k < w + D && k < N; k++) {
				const int64_t from = (q - k + N) % N, r = b[from * N + q], d = tok[from * N + q];
				int64_t held = k == 0 ? 0 : d * ((bwd ? 2 : 1) * H * s + 8 * K);
				const int64_t phases = max2(max2(2 * d * H + r * H, d * H + 2 * r * H), r * (2 * H + 4 * F)) * s;
				int64_t comp = k == 0 ? r * own_comp : bwd ? phases + 12 * d * K : r * (2 * H + 3 * F) * s + 8 * d * K;
				if (r == 0)
					held = comp = 0;
				sum += held;
				top = max2(top, comp - held);
			}
			exp = max2(exp, sum + top);
		}
		for (int64_t w = 1; w == 1 || w + D <= N; w++) {
			int64_t sum = 0, go = 0;
			for (int64_t k = w; k < w + D && k < N; k++) {
				const int64_t to = (q + k) % N, d = tok[q * N + to];
				if (b[q * N + to] == 0)
					continue;
				sum += 4 * T + d * (bwd ? 3 * H * s + 12 * K : 2 * H * s + 8 * K);
				go += d * ((bwd ? 2 : 1) * H * s + 8 * K);
			}
			if (sum > out) {
				out = sum;
				left = go;
			}
		}
		const int64_t ident = bwd ? 4 * b[q * N + q] : 0;
		if (exp + out + ident > worst) {
			worst = exp + out + ident;
			*leaving = left;
		}
	}
	return worst;
}

/* Long: the dispatchers' buffers side by side, one case each, so that
 * each term can be read against the others and against the graph it
 * models. */
int rmoe_memory_model(enum rmoe_dispatch d, const struct rmoe_mem_config *c,
                      struct rmoe_mem_estimate *o)
{
	int rc = check(c);
	if (rc)
		return rc;
	memset(o, 0, sizeof(*o));
	const int64_t T = c->tokens, H = c->hidden, F = c->ffn / c->etp, E = c->experts, K = c->topk;
	const int64_t N = c->nranks, s = c->dtype_bytes, Fs = c->shared_ffn, P = T * K;
	const int64_t W = E / N * 3 * H * F, even = (P + N - 1) / N;
	/* A hop's rows: the pairs of the busiest partition (of N*parts). */
	const int64_t parts = c->partitions > 1 ? c->partitions : 1;
	int64_t r = (int64_t)ceil(c->skew * (double)P / (double)(N * parts));
	if (N * parts == 1)
		r = P;
	if (c->chunk_rows > 0 && r > c->chunk_rows)
		r = c->chunk_rows;
	const int64_t M = (int64_t)ceil(c->skew * (double)P);
	/* Ring slots per relayed kind (graph/flow.c): hop h is received into
	 * slot h mod window, and a neighbour sends it only once the slot is
	 * free, so no message waits outside them. */
	const int64_t window = c->window > 0 ? c->window : RMOE_WINDOW_DEFAULT;

	/* The router and the gated shared expert's gate [H] (Qwen2-MoE), with
	 * their gradients, are 4-byte. */
	const int64_t gate = Fs > 0 && c->shared_gated ? 4 * H : 0;
	/* a2a-deepep keeps its peer counts beside the expert counts (E + N). */
	const int64_t routing = 4 * (H * E * 2 + T * E + 2 * P) + 4 * (2 * P + E) + 2 * gate +
	                        (d == RMOE_DISPATCH_ALLTOALL_DEEPEP ? 4 * (E + N) : 0);
	const int64_t weights = 2 * W * s + (Fs > 0 ? 6 * H * Fs * s : 0);
	const int64_t resident = routing + weights + T * H * s;
	o->resident_forward = resident + T * H * s;
	o->resident_backward = resident + 2 * T * H * s;
	o->weights_and_inputs = 4 * H * E + gate + W * s + (Fs > 0 ? 3 * H * Fs * s : 0) + T * H * s;

	/* The shared expert runs first, alone (forward_backward.c waits for it before the
	 * dispatch posts anything): work [T,3Fs], out or dx [T,H]; gated, the
	 * backward recomputes the output too (the gate's gradient reads it),
	 * then turns it into the gated dy. Its phase
	 * and the dispatch's never overlap: the peak is the larger. */
	const int64_t shared = Fs > 0 ? T * (3 * Fs + H) * s : 0;
	const int64_t shared_b = shared + (Fs > 0 && c->shared_gated ? T * H * s : 0);
	int64_t fwd = 0, bwd = 0, largest = max2(Fs > 0 ? T * 3 * Fs * s : 0, T * H * s);
	switch (d) {
	case RMOE_DISPATCH_RING_EXPERT: {
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
		fwd = max2(shared, relay_f + r * (2 * H + 3 * F) * s);
		bwd = max2(shared_b, relay_b + r * (2 * H + 4 * F) * s);
		o->fixed_backward = o->resident_backward + relay_b;
		o->per_row_backward = (2 * H + 4 * F) * s;
		largest = max2(largest, max2(N > 1 ? W * s : 0, r * max2(H, 4 * F) * s));
		break;
	}
	case RMOE_DISPATCH_RING_TOKEN: {
		/* One set of travelling buffers with two ranks, two otherwise; from
		 * hop 1 on a hop computes into partials (forward: outputs [T,H];
		 * backward: dx [T,H] and dg [T,K]) added into the visiting
		 * accumulators once they arrive. */
		int64_t sets = N > 1 ? (window < N - 1 ? window : N - 1) : 0;
		int64_t travel_f = sets * (2 * T * H * s + 2 * P * 4);
		int64_t travel_b = sets * (3 * T * H * s + 3 * P * 4);
		int64_t part_f = N > 1 ? T * H * s : 0, part_b = N > 1 ? T * H * s + P * 4 : 0;
		fwd = max2(shared, travel_f + part_f + r * (2 * H + 3 * F) * s);
		bwd = max2(shared_b, travel_b + part_b + r * (2 * H + 4 * F) * s);
		o->fixed_backward = o->resident_backward + travel_b + part_b;
		o->per_row_backward = (2 * H + 4 * F) * s;
		largest = max2(largest, r * max2(H, 4 * F) * s);
		break;
	}
	case RMOE_DISPATCH_ALLTOALL: {
		/* The lean all-to-all (graph/alltoall_fwd.c, alltoall_bwd.c):
		 * chunks of at most r rows (a block of one rank's pairs for one
		 * partition, as a ring hop, or the chunk rows), at most
		 * RMOE_A2A_DEPTH of them in flight in each role (fewer where there
		 * are fewer chunks: unchunked, N blocks in, N - 1 out).
		 * As the owner of experts, one chunk computing at a time (forward
		 * x, [r,3F], outputs: 2H + 3F per row; backward x (its dx in
		 * place), dy, [r,4F]: 2H + 4F, g and dg) and the others received
		 * or waiting to go back (forward H; backward x and dy, 2H, and g).
		 * As a sender of tokens: the permuted rows until sent and the
		 * results until added (forward x and outputs, 2H; backward x, dy
		 * and g out, dx and dg back, 3H and 2 routing values). The
		 * backward's identity pair order (4r, host memory of the pass)
		 * lives throughout. */
		const int64_t D = RMOE_A2A_DEPTH;
		const int64_t block = N == 1 ? P : (int64_t)ceil(c->skew * (double)P / (double)N);
		const int chunked = c->chunk_rows > 0 && c->chunk_rows < block;
		const int64_t in_exp = chunked ? D : (N < D ? N : D);
		const int64_t in_tok = N == 1 ? 0 : chunked ? D : (N - 1 < D ? N - 1 : D);
		fwd = max2(shared, r * ((2 * H + 3 * F) * s + (in_exp - 1) * H * s + in_tok * 2 * H * s));
		bwd = max2(shared, r * ((2 * H + 4 * F) * s + 8 + (in_exp - 1) * (2 * H * s + 4) +
		                        in_tok * (3 * H * s + 8) + 4));
		/* With the routing known and whole blocks, each rank's own blocks
		 * (a hot rank's are all expert blocks, a cold one's all token
		 * blocks, where the skew's bound gives every rank both). */
		int whole = c->blocks != NULL;
		for (int64_t q = 0; whole && c->chunk_rows > 0 && q < N * N; q++)
			whole = c->blocks[q] <= c->chunk_rows;
		if (whole) {
			fwd = max2(shared, a2a_blocks(c, (2 * H + 3 * F) * s, H * s, 2 * H * s, 0, H * s, &o->leaving_forward));
			bwd = max2(shared, a2a_blocks(c, (2 * H + 4 * F) * s + 8, 2 * H * s + 4, 3 * H * s + 8, 4, 2 * H * s + 4,
			                              &o->leaving_backward));
		}
		o->fixed_backward = o->resident_backward;
		o->per_row_backward = (2 * H + 4 * F) * s + 12 + (in_exp - 1) * (2 * H * s + 4) + in_tok * (3 * H * s + 8);
		/* forward x, backward x, dy and g of the token blocks */
		o->leaving_forward = r * in_tok * H * s;
		o->leaving_backward = r * in_tok * (2 * H * s + 4);
		largest = max2(largest, r * max2(H, 4 * F) * s);
		break;
	}
	case RMOE_DISPATCH_ALLTOALL_MEGATRON: {
		/* Megatron Core 0.13's MoEAlltoAllTokenDispatcher (the
		 * probabilities exchanged beside the tokens and applied in the
		 * expert, the unpermute without them; graph/alltoall_megatron.c),
		 * stage by stage, each exchange ordered as a collective on a
		 * stream by data dependencies (receives posted once its inputs
		 * exist, sent buffers freed before the next stage's first task).
		 * One exchange of rows holds my pairs' sent and the peers'
		 * received (my own handed over): ex rows; of probabilities, ex
		 * 4-byte values. The unsort map (4M, host memory of the pass)
		 * lives throughout, as the backward's identity pair order. */
		const int64_t own = even, ex = P + M - own;
		/* forward: x exchanged, sorted; probabilities exchanged and
		 * sorted beside the sorted x; the experts (x, [M,3F], outputs,
		 * probabilities); outputs scaled and unsorted; the combine
		 * exchange */
		int64_t f1 = s * ex * H, f2 = s * 2 * M * H, f3 = s * M * H + 4 * ex, f4 = s * M * H + 8 * M;
		int64_t f5 = s * M * (2 * H + 3 * F) + 4 * M, f6 = s * 2 * M * H + 4 * M;
		fwd = max2(max2(max2(f1, f2), max2(f3, f4)), max2(f5, f6)) + 4 * M;
		/* backward: the recompute's dispatch (as f1 to f4); the
		 * recompute into [M,4F] beside the sorted x and probabilities
		 * (kept as autograd keeps them); dy exchanged and sorted beside
		 * them; the expert backward adds the probabilities' gradients;
		 * dx rows and those gradients unsorted; the dx exchange beside
		 * the unsorted gradients; theirs */
		int64_t kept = s * M * (H + 4 * F) + 4 * M;
		int64_t b6 = kept + s * ex * H, b7 = kept + s * 2 * M * H, b8 = kept + s * M * H + 4 * M;
		int64_t b9 = s * 2 * M * H + 8 * M, b10 = s * ex * H + 4 * M, b11 = 4 * ex;
		bwd = max2(max2(max2(f1, f2), max2(f3, f4)), max2(max2(max2(kept, b6), max2(b7, b8)),
		                                                max2(b9, max2(b10, b11)))) + 4 * M;
		largest = max2(largest, s * max2(M * H, M * 4 * F));
		fwd = max2(fwd, shared);
		bwd = max2(bwd, shared_b);
		o->fixed_backward = o->resident_backward + bwd;
		o->per_row_backward = 0;
		break;
	}
	case RMOE_DISPATCH_ALLTOALL_DEEPEP: {
		/* Without the routing, every block the skew's bound (as a2a's),
		 * its tokens a uniform router's. */
		int64_t *b = NULL, *tok = NULL;
		const int64_t *bb = c->blocks, *bt = c->block_tokens;
		if (!bb || !bt) {
			const int64_t block = N == 1 ? P : (int64_t)ceil(c->skew * (double)P / (double)N);
			const int64_t dt = uniform_tokens(T, K, E, E / N, block);
			b = malloc(sizeof(int64_t) * (size_t)(2 * N * N));
			if (!b)
				return rmoe_error(RMOE_ENOMEM, "memory model: out of host memory");
			tok = b + N * N;
			for (int64_t i = 0; i < N * N; i++) {
				b[i] = block;
				tok[i] = dt;
			}
			bb = b;
			bt = tok;
		}
		int64_t rmax = 0;
		for (int64_t i = 0; i < N * N; i++)
			rmax = max2(rmax, bb[i]);
		fwd = max2(shared, deepep_blocks(c, bb, bt, 0, (2 * H + 3 * F) * s, &o->leaving_forward));
		bwd = max2(shared_b, deepep_blocks(c, bb, bt, 1, (2 * H + 4 * F) * s + 8, &o->leaving_backward));
		free(b);
		largest = max2(largest, rmax * max2(H, 4 * F) * s);
		o->fixed_backward = o->resident_backward + bwd;
		o->per_row_backward = 0;
		break;
	}
	default:
		return rmoe_error(RMOE_EINVAL, "memory model: dispatch %d has no model", (int)d);
	}
	/* where the shared expert's phase sets the peak, nothing is leaving */
	if (fwd == shared)
		o->leaving_forward = 0;
	if (bwd == shared || bwd == shared_b)
		o->leaving_backward = 0;
	o->dynamic_forward = fwd;
	o->dynamic_backward = bwd;
	o->peak_forward = o->resident_forward + fwd;
	o->peak_backward = o->resident_backward + bwd;
	o->peak = max2(o->peak_forward, o->peak_backward);
	o->largest_buffer = largest;
	return 0;
}

int rmoe_memory_cap_chunk(enum rmoe_dispatch d, const struct rmoe_mem_config *c, int64_t cap,
                          int64_t *chunk_rows)
{
	if (d == RMOE_DISPATCH_ALLTOALL_MEGATRON)
		return rmoe_error(RMOE_ENOTSUP,
		                  "a memory cap applies to the ring dispatchers and a2a; a2a-megatron builds its "
		                  "top-k-expanded buffers whole");
	if (d == RMOE_DISPATCH_ALLTOALL_DEEPEP)
		return rmoe_error(RMOE_ENOTSUP,
		                  "a memory cap applies to the ring dispatchers and a2a; a2a-deepep sends whole "
		                  "per-rank blocks");
	/* The chunks are planned against the cap less 1/RMOE_CAP_HEADROOM of
	 * it: the model orders the buffers as the graphs submit them, but a
	 * small one (routing of a visiting partition) may outlive its turn
	 * when the machine is loaded; 4 ranks of token routing were once
	 * measured 0.36% above an exactly planned cap. */
	const int64_t budget = cap - cap / RMOE_CAP_HEADROOM;
	struct rmoe_mem_config one = *c;
	one.chunk_rows = 1;
	struct rmoe_mem_estimate e;
	int rc = rmoe_memory_model(d, &one, &e);
	if (rc)
		return rc;
	if (e.peak > budget)
		return rmoe_error(RMOE_EINVAL,
		                  "memory cap %lld bytes is too small: the layer holds %lld bytes before a hop's "
		                  "rows (weights, gradients, inputs, routing, ring buffers) and a chunk of one "
		                  "row needs %lld bytes in all; expected a cap of at least %lld (with %.1f%% "
		                  "headroom)",
		                  (long long)cap, (long long)e.fixed_backward, (long long)e.peak,
		                  (long long)(e.peak + e.peak / (RMOE_CAP_HEADROOM - 1) + 1),
		                  100.0 / RMOE_CAP_HEADROOM);
	/* Largest chunk that fits: the peaks grow linearly in the chunk rows
	 * once a hop's rows exceed the shared expert's buffers; bisect. */
	int64_t lo = 1, hi = c->tokens * c->topk;
	while (lo < hi) {
		int64_t mid = lo + (hi - lo + 1) / 2;
		struct rmoe_mem_config t = *c;
		t.chunk_rows = mid;
		rmoe_memory_model(d, &t, &e);
		if (e.peak <= budget)
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
