/* The memory model (scheduler/model/memory_model.c) for one small configuration,
 * every term counted by hand here from the buffers the graphs hold, so that
 * the model is checked against an independent reading of graph/ and not
 * against itself.
 *
 * The configuration: T = 4 tokens, H = 2, F = 3, E = 4 experts, K = 2, on
 * N = 2 ranks, fp32 (4 bytes), no shared expert, no chunking, even routing.
 * P = T*K = 8 pairs; a partition holds E/N = 2 experts of 3*H*F = 18
 * floats: W = 36 floats = 144 bytes. With even routing a ring hop computes
 * P/N = 4 rows; the all-to-all's experts compute M = P = 8 rows on a rank
 * (skew 1 means every rank receives its even share of all ranks' pairs:
 * 4 from itself, 4 from the other). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cmocka_main.h"
#include "rmoe_memory_model.h"

static struct rmoe_mem_config tiny(void)
{
	struct rmoe_mem_config c;
	rmoe_mem_config_init(&c);
	c.tokens = 4;
	c.hidden = 2;
	c.ffn = 3;
	c.experts = 4;
	c.topk = 2;
	c.nranks = 2;
	return c;
}

/* Resident, every dispatcher (graph/layer.c's kept buffers):
 *   router and its gradient        2 * H*E  = 16 floats
 *   probabilities                  T*E      = 16 floats
 *   routing weights and dg         2 * P    = 16 floats
 *   top-k indices and pair order   2 * P    = 16 int32
 *   expert counts                  E        =  4 int32
 *     routing: (16 + 16 + 16 + 16 + 4) * 4 = 272 bytes
 *   owned partition and gradient   2 * W    = 72 floats = 288 bytes
 *   saved x                        T*H      =  8 floats =  32 bytes
 *   forward: the caller's y        T*H      =  32 bytes  -> 624
 *   backward: dy and dx            2 * T*H  =  64 bytes  -> 656 */
static void check_resident(const struct rmoe_mem_estimate *e)
{
	assert_int_equal(e->resident_forward, 272 + 288 + 32 + 32);
	assert_int_equal(e->resident_backward, 272 + 288 + 32 + 64);
	/* What a step finds before it starts: router (H*E floats), the owned
	 * weights (W), x: 32 + 144 + 32. */
	assert_int_equal(e->weights_and_inputs, 208);
}

/* The memory model's estimate of dispatch d for c, which it must accept. */
static struct rmoe_mem_estimate estimate(enum rmoe_dispatch d, const struct rmoe_mem_config *c)
{
	struct rmoe_mem_estimate e;
	assert_int_equal(rmoe_memory_model(d, c, &e), 0);
	return e;
}

/* The tiny layer's estimate for dispatch d, with its resident part and its
 * dynamic peaks, forward and backward, checked. */
static struct rmoe_mem_estimate tiny_estimate(enum rmoe_dispatch d, int64_t forward, int64_t backward)
{
	struct rmoe_mem_config c = tiny();
	struct rmoe_mem_estimate e = estimate(d, &c);
	check_resident(&e);
	assert_int_equal(e.dynamic_forward, forward);
	assert_int_equal(e.dynamic_backward, backward);
	return e;
}

/* Ring expert routing, 2 ranks: one weight receive buffer (the other rank's
 * partition, 144 bytes); a hop's 4 rows: gathered x [4*2], workspace
 * [4*3F = 4*9], out [4*2] = 52 floats = 208 bytes. Forward 144 + 208 = 352.
 * Backward: the weight receive buffer, two gradient relay buffers and one
 * partial gradient (4 * 144 = 576); a hop's gathered x [8], gathered dy
 * [8], workspace [4*4F = 48] = 64 floats = 256 bytes: 832. */
static void test_memory_model_ring_expert_by_hand(void **state)
{
	(void)state;
	struct rmoe_mem_config c = tiny();
	struct rmoe_mem_estimate e = tiny_estimate(RMOE_DISPATCH_RING_EXPERT, 144 + 208, 576 + 256);
	assert_int_equal(e.peak_forward, 624 + 352);
	assert_int_equal(e.peak_backward, 656 + 832);
	assert_int_equal(e.peak, 1488);
	/* A row of a hop adds gathered x, dy and its workspace: (2 + 2 + 12) * 4. */
	assert_int_equal(e.per_row_backward, 64);
	assert_int_equal(e.fixed_backward, 656 + 576);
	/* The largest buffer: a partition's weights (144), larger than a hop's
	 * workspace (4 * 12 floats = 192)? No: the workspace is. */
	assert_int_equal(e.largest_buffer, 192);
	/* Chunks of 1 row: 3 rows fewer, 3 * 64 bytes less backward. */
	c.chunk_rows = 1;
	e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.dynamic_backward, 576 + 64);
}

/* The striped ring (graph/pass/stripes.c), 2 ranks on two nodes: the
 * crossing hops in 2 stripes, each rank a relay of one piece of a
 * partition, 144 / 2 = 72 bytes, in a slot per relayed kind and hop mod
 * window: forward the weights (one slot: hop 1), 72 bytes more; backward
 * the weights, the accumulators (one each) and the gradients' return, 3 *
 * 72 = 216. With 4 stripes (nodes of 4 ranks) a rank may relay a piece of
 * 36 bytes each way: two roles, forward 72 more, backward 216. One stripe
 * or one rank: nothing more. Token routing relays what travels. */
static void test_memory_model_striped_ring_by_hand(void **state)
{
	(void)state;
	struct rmoe_mem_config c = tiny();
	c.stripes = 2;
	struct rmoe_mem_estimate e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.dynamic_forward, 144 + 208 + 72);
	assert_int_equal(e.dynamic_backward, 576 + 256 + 216);
	c.stripes = 4;
	e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.dynamic_forward, 144 + 208 + 2 * 36);
	assert_int_equal(e.dynamic_backward, 576 + 256 + 2 * 3 * 36);
	c.stripes = 1;
	e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.dynamic_forward, 144 + 208);
	c.stripes = 2;
	c.nranks = 1;
	c.experts = 2;
	e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	struct rmoe_mem_config flat = c;
	flat.stripes = 0;
	assert_int_equal(e.dynamic_backward, estimate(RMOE_DISPATCH_RING_EXPERT, &flat).dynamic_backward);
	/* Token routing, 2 stripes: a rank relays half of a travelling set
	 * (forward 128 bytes) and of the output's return (32): 80 more;
	 * backward half of a set (192) and of dx's and dg's return (64): 128. */
	c = tiny();
	c.stripes = 2;
	e = estimate(RMOE_DISPATCH_RING_TOKEN, &c);
	assert_int_equal(e.dynamic_forward, 128 + 32 + 208 + 80);
	assert_int_equal(e.dynamic_backward, 192 + 64 + 256 + 128);
}

/* Ring token routing, 2 ranks: one set of travelling buffers. Forward: x
 * [T*H = 8], the output accumulator [8], the pair order (8 int32) and
 * weights (8) = 32 values = 128 bytes; from hop 1 a partial of the outputs
 * [8] = 32 bytes; a hop's rows as for experts, 208: 368. Backward: x, dy,
 * the dx accumulator (3 * 8), the pair order, weights and dg (3 * 8) = 192
 * bytes; partials of dx [8] and dg [8] = 64; a hop's rows 256: 512. */
static void test_memory_model_ring_token_by_hand(void **state)
{
	(void)state;
	tiny_estimate(RMOE_DISPATCH_RING_TOKEN, 128 + 32 + 208, 192 + 64 + 256);
}

/* Megatron Core's all-to-all, 2 ranks, stage by stage
 * (graph/dispatch/alltoall_megatron.c), in bytes (activations 4 bytes, 2 per row;
 * probabilities 4 bytes each). An exchange holds my 8 pairs' rows sent
 * and the peer's 4 received (my own 4 handed over): 12 rows.
 * forward
 *   x exchanged: 12 rows: 96; sorted: received and sorted (2 * 8 rows): 128;
 *   probabilities exchanged beside the sorted x: 64 + 12 * 4 = 112; sorted:
 *   64 + 2 * 8 * 4 = 128;
 *   the experts: sorted x, workspace [8, 3F] and outputs, 8 * (2H + 3F)
 *   floats = 416, and the probabilities (32): 448;
 *   scaled and unsorted: outputs and unsorted (128) and probabilities (32):
 *   160; the combine exchange 96;
 *   peak 448, and the unsort map (8 int32: 32) throughout: 480.
 * backward
 *   the recompute's dispatch as above (at most 128); the recompute keeps
 *   sorted x (64), workspace [8, 4F] (384) and probabilities (32): 480;
 *   dy exchanged beside them: 480 + 96 = 576; sorted: 480 + 128 = 608;
 *   the expert backward: 480 + dy sorted (64) + dg rows (32) = 576;
 *   dx rows and dg unsorted: 128 + 64 = 192; the dx exchange beside the
 *   unsorted dg: 96 + 32; the dg exchange: 48;
 *   peak 608, and the identity pair order (32) throughout: 640. */
static void test_memory_model_alltoall_megatron_by_hand(void **state)
{
	(void)state;
	struct rmoe_mem_estimate e = tiny_estimate(RMOE_DISPATCH_ALLTOALL_MEGATRON, 480, 640);
	/* The largest buffer: the recompute's workspace, 8 rows of 4F. */
	assert_int_equal(e.largest_buffer, 96 * 4);
}

/* The lean all-to-all, same layer (graph/dispatch/alltoall_fwd.c, alltoall_bwd.c):
 * chunks are whole blocks of P/N = 4 rows; as the owner of experts a rank
 * has its own block and the peer's (2, the depth), one computing; as a
 * sender one block out (N - 1 = 1). In bytes (activations 4 bytes, 2 per
 * row):
 * forward
 *   computing: x (8 floats), workspace [4, 3F] (36), outputs (8): 208;
 *   the other block received or going back: 4 rows of H: 32;
 *   the block out: x rows sent (32) and results back (32): 64;
 *   peak 304.
 * backward
 *   computing: x (its dx in place) and dy (16 floats), workspace [4, 4F]
 *   (48 floats), g and dg (8 values): 288;
 *   the other block: x, dy (16 floats) and g (4): 80;
 *   the block out: x, dy and g (16 floats, 4 weights), dx and dg back (8
 *   floats, 4 values): 128;
 *   the identity pair order (4 int32): 16; peak 512. */
static void test_memory_model_alltoall_by_hand(void **state)
{
	(void)state;
	struct rmoe_mem_estimate e = tiny_estimate(RMOE_DISPATCH_ALLTOALL, 304, 512);
	/* The largest buffer: the backward's workspace, 4 rows of 4F. */
	assert_int_equal(e.largest_buffer, 48 * 4);
	/* Chunks of 2 rows: the depth's 2 chunks in flight in each role. Per
	 * row forward: computing 52 bytes, the other chunk in 8, the two out
	 * 2 * 16. */
	struct rmoe_mem_config c = tiny();
	c.chunk_rows = 2;
	e = estimate(RMOE_DISPATCH_ALLTOALL, &c);
	assert_int_equal(e.dynamic_forward, 2 * (52 + 8 + 32));
	/* a cap fits it: the chunk rows that fit a cap a little above the
	 * 2-row chunks' peak are 2 */
	int64_t rows = 0;
	assert_int_equal(rmoe_memory_cap_chunk(RMOE_DISPATCH_ALLTOALL, &c, e.peak + e.peak / 16, &rows), 0);
	assert_int_equal(rows, 2);
}

/* DeepEP's dispatch on a2a's pipeline, same layer (graph/dispatch/alltoall_deepep.c):
 * whole blocks of r = 4 pairs; a uniform router sends a block 4 distinct
 * tokens here (a token meets the other rank's 2 experts with probability
 * 1 - C(2,2)/C(4,2) = 5/6: ceil(5/6 * 4) = 4, at most the 4 tokens). Its
 * peer counts [E + N] add 6 int32 to the resident routing (24 bytes).
 * forward, the owner of experts: the own block computing (a2a's: 4 rows of
 * 2H + 3F, 208), nothing once off the experts (its outputs are added
 * before the peer's block is expanded); the peer's block computing,
 * expanded rows (8 floats), workspace (36), outputs (8), codes and weights
 * (D*K = 8 each): 272, or held, rows (D*H = 8), codes, weights: 96. The
 * window: the peer's 96 held + the larger rise, the own block's 208: 304.
 * The block out: token list (T = 4 int32), rows, codes, weights out and
 * the combined rows back (4 * 8 values): 144. Peak 448; leaving: the
 * block's inputs (96).
 * backward: the own block computing as a2a's (288); the peer's computing,
 * x and dy expanded (16 floats), workspace [4, 4F] (48), dg, codes,
 * weights (24 values): 352, held x, dy, codes, weights: 128; the window
 * 128 + 288 = 416. The block out: token list, x, dy, codes, weights, dx
 * and dg back: 16 + 6 * 32 = 208; the own block's identity pair order (4
 * int32): 16. Peak 640; leaving 128. */
static void test_memory_model_alltoall_deepep_by_hand(void **state)
{
	(void)state;
	struct rmoe_mem_config c = tiny();
	struct rmoe_mem_estimate e = estimate(RMOE_DISPATCH_ALLTOALL_DEEPEP, &c);
	assert_int_equal(e.resident_forward, 272 + 24 + 288 + 32 + 32);
	assert_int_equal(e.dynamic_forward, 448);
	assert_int_equal(e.leaving_forward, 96);
	assert_int_equal(e.dynamic_backward, 640);
	assert_int_equal(e.leaving_backward, 128);
	assert_int_equal(e.largest_buffer, 48 * 4);
	/* The routing seen: rank 0 sends rank 1 one token with both its pairs
	 * there (r = 2, D = 1), rank 1 sends rank 0 three tokens of one pair
	 * each; the own blocks of 6 and 5 pairs. Rank 0's forward: own
	 * computing 6*52 = 312 + the received 3 tokens held 3*(8+16) = 72 ->
	 * 384 (the received block computing, 3*52 + 8*3*2 = 204, the own
	 * outputs added by then, is less); its block out 16 + 1 * 32 = 48: 432. Rank 1's: own
	 * computing 5*52 = 260 + the received 1 token held 24 = 284; out 16 +
	 * 3 * 32 = 112: 396. The model takes the larger, 432. */
	const int64_t blocks[8] = {6, 2, 3, 5, /* tokens */ 4, 1, 3, 4};
	c.blocks = blocks;
	c.block_tokens = blocks + 4;
	e = estimate(RMOE_DISPATCH_ALLTOALL_DEEPEP, &c);
	assert_int_equal(e.dynamic_forward, 432);
	/* No cap: its blocks are whole. */
	int64_t rows = 0;
	assert_int_equal(rmoe_memory_cap_chunk(RMOE_DISPATCH_ALLTOALL_DEEPEP, &c, 1 << 20, &rows), RMOE_ENOTSUP);
}

/* Two partitions per rank (a ring of 4 partitions over 2 ranks): a hop
 * computes P/4 = 2 rows instead of 4, so the backward's hop rows halve
 * (2 * 64 bytes instead of 4 * 64); nothing else changes. */
static void test_memory_model_partitions_by_hand(void **state)
{
	(void)state;
	struct rmoe_mem_config c = tiny();
	c.partitions = 2;
	struct rmoe_mem_estimate e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.dynamic_backward, 576 + 2 * 64);
	assert_int_equal(e.dynamic_forward, 144 + 2 * 52);
	/* The busiest of the 4 partitions may hold every pair: skew up to 4. */
	c.skew = 4;
	e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.dynamic_backward, 576 + 8 * 64);
	c.skew = 4.5;
	assert_int_equal(rmoe_memory_model(RMOE_DISPATCH_RING_EXPERT, &c, &e), RMOE_EINVAL);
}

/* The window (graph/pass/flow.c) at 4 ranks, a partition 1 expert * 3*H*F = 18
 * floats = 72 bytes: hops 1..3 arrive in min(window, 3) weight slots, the
 * gradients of hops 0..3 in min(window, 4). Window 3 adds a weight slot
 * forward, a weight and a gradient slot backward; a window of 8 one more
 * gradient slot (4 hops); a bad window is refused, naming it. */
/* Token counts per rank (rmoe_layer_set_tokens), the tiny layer:
 * - every rank at 4 tokens: the same estimate as without per-rank counts;
 * - a capacity of 8: the kept buffers grow by 4 tokens of 56 bytes (T*E
 *   probabilities, 2P routing floats and 2P int32: 48, x: 8), 224 bytes;
 * - token routing with 2 and 4 tokens: rank 1 (4) holds the tiny layer's
 *   992 and 1168. Rank 0 keeps the same buffers (capacity 4) but the
 *   caller's y is 2 rows: 608 forward, and dy and dx 624 backward; every
 *   partition travels at 4 tokens, its own padded to them too: the
 *   accumulators (forward y 32; backward dx 32 and dg 32) and the inputs
 *   (forward x 32 and routing 64, backward also dy: 128), which may have
 *   left before the peak (leaving): forward 128 + 32 + 96 + 32 + 208 =
 *   496, backward 192 + 64 + 128 + 64 + 256 = 704. The estimate is the
 *   larger of each pass: 1104 and 1328, rank 0's, 96 and 128 leaving;
 * - expert routing with 0 and 4 tokens: rank 1's, the tiny layer's. */
static void test_memory_model_uneven_counts_by_hand(void **state)
{
	(void)state;
	struct rmoe_mem_config c = tiny();
	struct rmoe_mem_estimate plain = estimate(RMOE_DISPATCH_RING_TOKEN, &c);
	const int64_t same[2] = {4, 4}, uneven[2] = {2, 4}, empty[2] = {0, 4};
	c.rank_tokens = same;
	struct rmoe_mem_estimate e = estimate(RMOE_DISPATCH_RING_TOKEN, &c);
	assert_int_equal(e.peak_forward, plain.peak_forward);
	assert_int_equal(e.peak_backward, plain.peak_backward);
	c.capacity = 8;
	e = estimate(RMOE_DISPATCH_RING_TOKEN, &c);
	assert_int_equal(e.resident_forward, 624 + 224);
	assert_int_equal(e.peak_forward, plain.peak_forward + 224);
	c.capacity = 0;
	c.rank_tokens = uneven;
	e = estimate(RMOE_DISPATCH_RING_TOKEN, &c);
	assert_int_equal(e.peak_forward, 608 + 496);
	assert_int_equal(e.peak_backward, 624 + 704);
	assert_int_equal(e.leaving_forward, 96);
	assert_int_equal(e.leaving_backward, 128);
	c.rank_tokens = empty;
	e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	struct rmoe_mem_config t = tiny();
	plain = estimate(RMOE_DISPATCH_RING_EXPERT, &t);
	assert_int_equal(e.peak_forward, plain.peak_forward);
	assert_int_equal(e.peak_backward, plain.peak_backward);
	const int64_t bad[2] = {-1, 4};
	c.rank_tokens = bad;
	assert_int_equal(rmoe_memory_model(RMOE_DISPATCH_RING_EXPERT, &c, &e), RMOE_EINVAL);
}

static void test_memory_model_window_counts_slots(void **state)
{
	(void)state;
	struct rmoe_mem_config c = tiny();
	c.nranks = 4;
	struct rmoe_mem_estimate w2, w3, w8;
	w2 = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	c.window = 3;
	w3 = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	c.window = 8;
	w8 = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(w3.dynamic_forward - w2.dynamic_forward, 72);
	assert_int_equal(w3.dynamic_backward - w2.dynamic_backward, 2 * 72);
	assert_int_equal(w8.dynamic_forward, w3.dynamic_forward);
	assert_int_equal(w8.dynamic_backward - w3.dynamic_backward, 72);
	/* Token routing: one more set of travelling buffers (x, y, pair order,
	 * weights: 2*T*H*4 + 2*T*K*4 = 128 bytes) forward at window 3. */
	struct rmoe_mem_estimate t2, t3;
	c.window = 0;
	t2 = estimate(RMOE_DISPATCH_RING_TOKEN, &c);
	c.window = 3;
	t3 = estimate(RMOE_DISPATCH_RING_TOKEN, &c);
	assert_int_equal(t3.dynamic_forward - t2.dynamic_forward, 128);
	c.window = 1;
	assert_int_equal(rmoe_memory_model(RMOE_DISPATCH_RING_EXPERT, &c, &w2), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_strerror(RMOE_EINVAL), "window = 1"));
}

/* bf16 halves activations and weights, not the routing (4-byte). */
static void test_memory_model_bf16_halves_the_tensors(void **state)
{
	(void)state;
	struct rmoe_mem_config c = tiny();
	c.dtype_bytes = 2;
	struct rmoe_mem_estimate e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.resident_forward, 272 + (288 + 32 + 32) / 2);
	assert_int_equal(e.dynamic_backward, (576 + 256) / 2);
}

/* A shared expert of Fs = 50, wide enough that its phase is the peak.
 * Resident: its weights and gradient, 6 * H*Fs = 600 floats = 2400 bytes;
 * gated, its gate and the gate's gradient, 2 * H fp32 = 16 bytes more. Its
 * phase (forward_backward.c): work [T*3Fs = 600] and the output (forward)
 * or its dx [T*H = 8]: 608 floats = 2432 bytes; the gated backward also
 * holds the recomputed output, turned into the gated dy, beside dx: 8
 * floats more, 2464. */
static void test_memory_model_shared_expert_by_hand(void **state)
{
	(void)state;
	struct rmoe_mem_config c = tiny();
	c.shared_ffn = 50;
	struct rmoe_mem_estimate e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.resident_forward, 624 + 2400);
	assert_int_equal(e.dynamic_forward, 2432);
	assert_int_equal(e.dynamic_backward, 2432);
	c.shared_gated = 1;
	e = estimate(RMOE_DISPATCH_RING_EXPERT, &c);
	assert_int_equal(e.resident_forward, 624 + 2400 + 16);
	assert_int_equal(e.dynamic_forward, 2432);
	assert_int_equal(e.dynamic_backward, 2464);
	e = estimate(RMOE_DISPATCH_ALLTOALL_MEGATRON, &c);
	assert_int_equal(e.dynamic_backward >= 2464, 1);
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_memory_model_ring_expert_by_hand),
               cmocka_unit_test(test_memory_model_striped_ring_by_hand),
               cmocka_unit_test(test_memory_model_ring_token_by_hand),
               cmocka_unit_test(test_memory_model_alltoall_by_hand),
               cmocka_unit_test(test_memory_model_alltoall_megatron_by_hand),
               cmocka_unit_test(test_memory_model_alltoall_deepep_by_hand),
               cmocka_unit_test(test_memory_model_bf16_halves_the_tensors),
               cmocka_unit_test(test_memory_model_partitions_by_hand),
               cmocka_unit_test(test_memory_model_shared_expert_by_hand),
               cmocka_unit_test(test_memory_model_window_counts_slots),
               cmocka_unit_test(test_memory_model_uneven_counts_by_hand))
