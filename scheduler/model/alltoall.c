/* The all-to-alls' memory models: the lean pipelined a2a, Megatron Core
 * 0.13's stages and DeepEP's whole blocks. memory_model.c's head comment
 * names the buffers and the terms. */
#include <math.h>
#include <stdlib.h>

#include "rmoe_model_terms.h"

/* a2a's temporaries for a known routing (c->blocks), whole blocks: rank q
 * computes its own block, then those of q-1, q-2, ... and sends to q+1,
 * q+2, ...; at most rmoe_a2a_depth consecutive blocks of each role are
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
	const int64_t N = c->nranks, D = rmoe_a2a_depth(c->window, c->nranks, c->capped);
	const int64_t *b = c->blocks;
	int64_t worst = 0;
	for (int64_t q = 0; q < N; q++) {
		int64_t exp = 0, out = 0, largest = 0, rows_out = 0;
		for (int64_t w = 0; w == 0 || w + D <= N; w++) {
			int64_t sum = 0, top = 0;
			for (int64_t k = w; k < w + D && k < N; k++) {
				const int64_t rows = b[((q - k + N) % N) * N + q];
				sum += rows * held;
				top = rmoe_max2(top, rows * (comp - held));
			}
			exp = rmoe_max2(exp, sum + top);
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
			largest = rmoe_max2(largest, b[s * N + q]);
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
 * of a2a_blocks: at most rmoe_a2a_depth consecutive blocks of each role
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
	const int64_t N = c->nranks, D = rmoe_a2a_depth(c->window, c->nranks, c->capped), T = c->tokens, H = c->hidden,
	              K = c->topk;
	const int64_t F = c->ffn / c->etp, s = c->dtype_bytes;
	int64_t worst = 0;
	for (int64_t q = 0; q < N; q++) {
		int64_t exp = 0, out = 0, left = 0;
		for (int64_t w = 0; w == 0 || w + D <= N; w++) {
			int64_t sum = 0, top = 0;
			for (int64_t k = w; k < w + D && k < N; k++) {
				const int64_t from = (q - k + N) % N, r = b[from * N + q], d = tok[from * N + q];
				int64_t held = k == 0 ? 0 : d * ((bwd ? 2 : 1) * H * s + 8 * K);
				const int64_t phases = rmoe_max2(rmoe_max2(2 * d * H + r * H, d * H + 2 * r * H), r * (2 * H + 4 * F)) * s;
				int64_t comp = k == 0 ? r * own_comp : bwd ? phases + 12 * d * K : r * (2 * H + 3 * F) * s + 8 * d * K;
				if (r == 0)
					held = comp = 0;
				sum += held;
				top = rmoe_max2(top, comp - held);
			}
			exp = rmoe_max2(exp, sum + top);
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

/* The lean all-to-all (graph/dispatch/alltoall_fwd.c, alltoall_bwd.c). */
int rmoe_model_alltoall(const struct rmoe_model_terms *t, struct rmoe_model_phase *p, struct rmoe_mem_estimate *o)
{
	const struct rmoe_mem_config *c = t->c;
	const int64_t N = t->N, P = t->P, s = t->s, r = t->r, H = t->H, F = t->F;
	const int64_t shared = t->shared;
	int64_t fwd, bwd, largest = p->largest;
	/* The lean all-to-all (graph/dispatch/alltoall_fwd.c, alltoall_bwd.c):
	 * chunks of at most r rows (a block of one rank's pairs for one
	 * partition, as a ring hop, or the chunk rows), at most
	 * rmoe_a2a_depth of them in flight in each role (fewer where there
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
	const int64_t D = rmoe_a2a_depth(c->window, N, c->capped);
	const int64_t block = N == 1 ? P : (int64_t)ceil(c->skew * (double)P / (double)N);
	const int chunked = c->chunk_rows > 0 && c->chunk_rows < block;
	const int64_t in_exp = chunked ? D : (N < D ? N : D);
	const int64_t in_tok = N == 1 ? 0 : chunked ? D : (N - 1 < D ? N - 1 : D);
	fwd = rmoe_max2(shared, r * ((2 * H + 3 * F) * s + (in_exp - 1) * H * s + in_tok * 2 * H * s));
	bwd = rmoe_max2(shared, r * ((2 * H + 4 * F) * s + 8 + (in_exp - 1) * (2 * H * s + 4) +
	                        in_tok * (3 * H * s + 8) + 4));
	/* With the routing known and whole blocks, each rank's own blocks
	 * (a hot rank's are all expert blocks, a cold one's all token
	 * blocks, where the skew's bound gives every rank both). */
	int whole = c->blocks != NULL;
	for (int64_t q = 0; whole && c->chunk_rows > 0 && q < N * N; q++)
		whole = c->blocks[q] <= c->chunk_rows;
	if (whole) {
		fwd = rmoe_max2(shared, a2a_blocks(c, (2 * H + 3 * F) * s, H * s, 2 * H * s, 0, H * s, &o->leaving_forward));
		bwd = rmoe_max2(shared, a2a_blocks(c, (2 * H + 4 * F) * s + 8, 2 * H * s + 4, 3 * H * s + 8, 4, 2 * H * s + 4,
		                              &o->leaving_backward));
	}
	o->fixed_backward = o->resident_backward;
	o->per_row_backward = (2 * H + 4 * F) * s + 12 + (in_exp - 1) * (2 * H * s + 4) + in_tok * (3 * H * s + 8);
	/* forward x, backward x, dy and g of the token blocks */
	o->leaving_forward = r * in_tok * H * s;
	o->leaving_backward = r * in_tok * (2 * H * s + 4);
	largest = rmoe_max2(largest, r * rmoe_max2(H, 4 * F) * s);
	return rmoe_model_done(p, fwd, bwd, largest);
}

/* Megatron Core 0.13's alltoall dispatcher, stage by stage. */
int rmoe_model_alltoall_megatron(const struct rmoe_model_terms *t, struct rmoe_model_phase *p,
                                 struct rmoe_mem_estimate *o)
{
	const int64_t P = t->P, M = t->M, even = t->even, s = t->s, H = t->H, F = t->F;
	const int64_t shared = t->shared, shared_b = t->shared_b;
	int64_t fwd, bwd, largest = p->largest;
	/* Megatron Core 0.13's MoEAlltoAllTokenDispatcher (the
	 * probabilities exchanged beside the tokens and applied in the
	 * expert, the unpermute without them; graph/dispatch/alltoall_megatron.c),
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
	fwd = rmoe_max2(rmoe_max2(rmoe_max2(f1, f2), rmoe_max2(f3, f4)), rmoe_max2(f5, f6)) + 4 * M;
	/* backward: the recompute's dispatch (as f1 to f4); the
	 * recompute into [M,4F] beside the sorted x and probabilities
	 * (kept as autograd keeps them); dy exchanged and sorted beside
	 * them; the expert backward adds the probabilities' gradients;
	 * dx rows and those gradients unsorted; the dx exchange beside
	 * the unsorted gradients; theirs */
	int64_t kept = s * M * (H + 4 * F) + 4 * M;
	int64_t b6 = kept + s * ex * H, b7 = kept + s * 2 * M * H, b8 = kept + s * M * H + 4 * M;
	int64_t b9 = s * 2 * M * H + 8 * M, b10 = s * ex * H + 4 * M, b11 = 4 * ex;
	const int64_t dispatch = rmoe_max2(rmoe_max2(f1, f2), rmoe_max2(f3, f4));
	bwd = rmoe_max2(dispatch, rmoe_max2(rmoe_max2(rmoe_max2(kept, b6), rmoe_max2(b7, b8)),
	                                    rmoe_max2(b9, rmoe_max2(b10, b11)))) + 4 * M;
	largest = rmoe_max2(largest, s * rmoe_max2(M * H, M * 4 * F));
	fwd = rmoe_max2(fwd, shared);
	bwd = rmoe_max2(bwd, shared_b);
	return rmoe_model_whole(p, o, fwd, bwd, largest);
}

/* DeepEP's normal mode: a2a's pipeline of whole blocks of tokens. */
int rmoe_model_alltoall_deepep(const struct rmoe_model_terms *t, struct rmoe_model_phase *p,
                               struct rmoe_mem_estimate *o)
{
	const struct rmoe_mem_config *c = t->c;
	const int64_t N = t->N, P = t->P, T = t->T, K = t->K, E = t->E, s = t->s, H = t->H, F = t->F;
	const int64_t shared = t->shared, shared_b = t->shared_b;
	int64_t fwd, bwd, largest = p->largest;
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
		rmax = rmoe_max2(rmax, bb[i]);
	fwd = rmoe_max2(shared, deepep_blocks(c, bb, bt, 0, (2 * H + 3 * F) * s, &o->leaving_forward));
	bwd = rmoe_max2(shared_b, deepep_blocks(c, bb, bt, 1, (2 * H + 4 * F) * s + 8, &o->leaving_backward));
	free(b);
	largest = rmoe_max2(largest, rmax * rmoe_max2(H, 4 * F) * s);
	return rmoe_model_whole(p, o, fwd, bwd, largest);
}
