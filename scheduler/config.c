/* Configuration: defaults, checks that name the bad value, the cross-rank
 * digest. (What the environment sets, rmoe_layer_config_init,
 * is system/'s.) */
#include <string.h>

#include "rmoe_hash.h"
#include "rmoe_scheduler.h"

/* StarPU 1.3 vector handles count elements in 32 bits. */
#define RMOE_MAX_HANDLE_ELEMS 4294967295LL

void rmoe_layer_config_defaults(struct rmoe_layer_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	/* Qwen3-30B-A3B (H=2048, F=768, E=128, K=8) with H, F and the paper's
	 * 49152 tokens per GPU (§2) divided by 16: every buffer keeps its
	 * proportions, so memory ratios are those of the full-size layer. */
	cfg->hidden = 128;
	cfg->ffn = 48;
	cfg->experts = 128;
	cfg->topk = 8;
	cfg->tokens = 3072;
	cfg->norm_topk = 1;
	cfg->shared_ffn = 0;
	cfg->shared_gated = 0;
	cfg->dispatch = RMOE_DISPATCH_RING_EXPERT;
	cfg->dtype = RMOE_DTYPE_F32;
	cfg->chunk_rows = 0;
	cfg->partitions = 1;
	cfg->overlap = 1;
	cfg->deterministic = 0;
	cfg->check_finite = 0;
	cfg->wait_timeout = 0;
	cfg->window = 0;
	cfg->stripes = 0;
}

int rmoe_config_window(const struct rmoe_layer_config *cfg)
{
	return cfg->window > 0 ? cfg->window : RMOE_WINDOW_DEFAULT;
}

/* a * b elements must fit one StarPU handle. */
static int check_elems(const char *what, int64_t a, int64_t b)
{
	int64_t n;
	if (__builtin_mul_overflow(a, b, &n) || n > RMOE_MAX_HANDLE_ELEMS)
		return rmoe_error(RMOE_EINVAL,
		                  "%s = %lld x %lld elements: more than %lld, the largest buffer StarPU 1.3 "
		                  "can register; use fewer tokens per rank or more ranks",
		                  what, (long long)a, (long long)b, RMOE_MAX_HANDLE_ELEMS);
	return 0;
}

/* Long: one check per field, in the order of the struct, each with the
 * message that names its value: a list reads best whole. */
int rmoe_config_check(const struct rmoe_layer_config *c, int nranks)
{
	if (!c)
		return rmoe_error(RMOE_EINVAL, "layer config is NULL");
	struct {
		const char *name;
		int64_t v;
	} pos[] = {{"hidden", c->hidden}, {"ffn", c->ffn}, {"experts", c->experts},
	           {"topk", c->topk}, {"tokens", c->tokens}};
	for (unsigned i = 0; i < sizeof(pos) / sizeof(pos[0]); i++)
		if (pos[i].v <= 0)
			return rmoe_error(RMOE_EINVAL, "%s = %lld: expected a positive integer", pos[i].name,
			                  (long long)pos[i].v);
	if (c->topk > c->experts)
		return rmoe_error(RMOE_EINVAL, "topk = %lld is larger than experts = %lld: expected 1 <= K <= E",
		                  (long long)c->topk, (long long)c->experts);
	if (nranks <= 0)
		return rmoe_error(RMOE_EINVAL, "%d ranks: expected at least one", nranks);
	if (c->experts % nranks != 0)
		return rmoe_error(RMOE_EINVAL,
		                  "experts = %lld is not divisible by the %d ranks of the group: expected a "
		                  "multiple of %d",
		                  (long long)c->experts, nranks, nranks);
	if (c->shared_ffn < 0 || c->shared_ffn > RMOE_MAX_HANDLE_ELEMS)
		return rmoe_error(RMOE_EINVAL,
		                  "shared_ffn = %lld: expected 0 (no shared expert) or a width of at most %lld",
		                  (long long)c->shared_ffn, RMOE_MAX_HANDLE_ELEMS);
	if (c->shared_gated != 0 && c->shared_gated != 1)
		return rmoe_error(RMOE_EINVAL, "shared_gated = %d: expected 0 (ungated) or 1 (gated)", c->shared_gated);
	if (c->shared_gated && c->shared_ffn == 0)
		return rmoe_error(RMOE_EINVAL, "shared_gated = 1 but shared_ffn = 0: a gated shared expert needs a "
		                  "width (shared_ffn > 0)");
	if (c->mem_cap < 0)
		return rmoe_error(RMOE_EINVAL, "mem_cap = %lld: expected 0 (no cap) or a byte count",
		                  (long long)c->mem_cap);
	if (c->partitions < 0)
		return rmoe_error(RMOE_EINVAL, "partitions = %lld: expected 0 or 1 (one per rank) or a count dividing the "
		                  "experts of a rank", (long long)c->partitions);
	if (c->partitions > 1 && nranks > 0 && c->experts % nranks == 0 && (c->experts / nranks) % c->partitions)
		return rmoe_error(RMOE_EINVAL,
		                  "partitions = %lld does not divide the %lld experts of each of the %d rank(s): expected a "
		                  "divisor of experts/ranks",
		                  (long long)c->partitions, (long long)(c->experts / nranks), nranks);
	if (c->partitions > 1 && rmoe_dispatch_alltoall(c->dispatch))
		return rmoe_error(RMOE_ENOTSUP, "partitions = %lld: partitions are hops of a ring; the all-to-all "
		                  "dispatch has none (expected 0 or 1)", (long long)c->partitions);
	if (c->chunk_rows < 0)
		return rmoe_error(RMOE_EINVAL, "chunk_rows = %lld: expected 0 (whole hop) or a row count",
		                  (long long)c->chunk_rows);
	const struct rmoe_dispatcher *row = rmoe_dispatcher_of(c->dispatch);
	if (c->chunk_rows > 0 && row && row->whole_blocks)
		return rmoe_error(RMOE_ENOTSUP, "chunk_rows = %lld: %s sends whole per-rank blocks (expected 0; "
		                  "chunks apply to the rings and a2a)", (long long)c->chunk_rows, row->name);
	/* A relay forwards hop h out of the buffer it received it in while
	 * hop h+1 arrives: with one buffer per rank, every rank would wait for
	 * its right neighbour to free the buffer it is itself sending from. */
	if (c->window < 0 || c->window == 1)
		return rmoe_error(RMOE_EINVAL,
		                  "window = %d: expected 0 (default %d) or at least 2 receive buffers per relayed "
		                  "kind (a ring relays hop h from one buffer while hop h+1 arrives in another)",
		                  c->window, RMOE_WINDOW_DEFAULT);
	if (c->stripes < 0 || c->stripes > RMOE_STRIPES_MAX)
		return rmoe_error(RMOE_EINVAL, "stripes = %d: expected 0 (as planned) or 1 to %d stripes per node-crossing hop",
		                  c->stripes, RMOE_STRIPES_MAX);
	if (c->stripes > 1 && row && !row->striped)
		return rmoe_error(RMOE_ENOTSUP, "stripes = %d: striped hops are built for the rings (ring, token); "
		                  "%s takes 0 or 1", c->stripes, row ? row->name : "this dispatch");
	if (c->norm_topk != 0 && c->norm_topk != 1)
		return rmoe_error(RMOE_EINVAL, "norm_topk = %d: expected 0 or 1", c->norm_topk);
	if (c->overlap != 0 && c->overlap != 1)
		return rmoe_error(RMOE_EINVAL, "overlap = %d: expected 0 or 1", c->overlap);
	if (c->deterministic != 0 && c->deterministic != 1)
		return rmoe_error(RMOE_EINVAL, "deterministic = %d: expected 0 or 1", c->deterministic);
	if (c->check_finite != 0 && c->check_finite != 1)
		return rmoe_error(RMOE_EINVAL, "check_finite = %d: expected 0 or 1", c->check_finite);
	if (!(c->wait_timeout >= 0 && c->wait_timeout <= 1e9))
		return rmoe_error(RMOE_EINVAL,
		                  "wait_timeout = %g: expected 0 (wait forever) or seconds up to 1e9 (a "
		                  "malformed RMOE_WAIT_TIMEOUT in the environment gives -1)",
		                  c->wait_timeout);
	char names[128];
	if (!row)
		return rmoe_error(RMOE_EINVAL, "dispatch = %d: expected one of %s", (int)c->dispatch,
		                  rmoe_dispatch_names(names, sizeof(names)));
	if (c->dtype != RMOE_DTYPE_F32 && c->dtype != RMOE_DTYPE_BF16)
		return rmoe_error(RMOE_EINVAL, "dtype = %d: expected f32 or bf16", (int)c->dtype);

	int rc;
	int64_t pairs;
	if (__builtin_mul_overflow(c->tokens, c->topk, &pairs) || pairs > INT32_MAX)
		return rmoe_error(RMOE_EINVAL,
		                  "tokens x topk = %lld x %lld pairs: more than %d, the pair index range",
		                  (long long)c->tokens, (long long)c->topk, INT32_MAX);
	/* Each extent is one dimension of some buffer: bounding hidden and ffn
	 * keeps the 3 x and 4 x products below from overflowing int64. */
	if (c->hidden > RMOE_MAX_HANDLE_ELEMS || c->ffn > RMOE_MAX_HANDLE_ELEMS)
		return rmoe_error(RMOE_EINVAL,
		                  "%s = %lld: expected at most %lld, the largest buffer StarPU 1.3 can register",
		                  c->hidden > RMOE_MAX_HANDLE_ELEMS ? "hidden" : "ffn",
		                  (long long)(c->hidden > RMOE_MAX_HANDLE_ELEMS ? c->hidden : c->ffn),
		                  RMOE_MAX_HANDLE_ELEMS);
	if ((rc = check_elems("tokens x hidden", c->tokens, c->hidden)) ||
	    (rc = check_elems("tokens x experts", c->tokens, c->experts)) ||
	    (rc = check_elems("pairs x hidden", pairs, c->hidden)) ||
	    (rc = check_elems("pairs x 4 ffn", pairs, 4 * c->ffn)) ||
	    (rc = check_elems("hidden x experts", c->hidden, c->experts)))
		return rc;
	int64_t hf;
	if (__builtin_mul_overflow(c->hidden, c->ffn, &hf) || __builtin_mul_overflow(hf, 3, &hf))
		return rmoe_error(RMOE_EINVAL,
		                  "3 x hidden x ffn = 3 x %lld x %lld overflows: expected one expert's weights "
		                  "to fit one StarPU buffer (%lld elements)",
		                  (long long)c->hidden, (long long)c->ffn, RMOE_MAX_HANDLE_ELEMS);
	if ((rc = check_elems("partition weights (3 x hidden x ffn x experts/ranks)", hf,
	                      c->experts / nranks)))
		return rc;
	if (c->shared_ffn > 0 && ((rc = check_elems("shared expert weights", 3 * c->hidden, c->shared_ffn)) ||
	                          (rc = check_elems("tokens x 3 shared_ffn", c->tokens, 3 * c->shared_ffn))))
		return rc;
	return 0;
}

/* FNV-1a over the fields that every rank must agree on. */
uint64_t rmoe_config_hash(const struct rmoe_layer_config *c)
{
	uint64_t h = rmoe_hash_init();
	h = rmoe_hash_i64(h, c->hidden);
	h = rmoe_hash_i64(h, c->ffn);
	h = rmoe_hash_i64(h, c->experts);
	h = rmoe_hash_i64(h, c->topk);
	h = rmoe_hash_i64(h, c->tokens);
	h = rmoe_hash_i64(h, c->norm_topk);
	h = rmoe_hash_i64(h, c->shared_ffn);
	h = rmoe_hash_i64(h, c->shared_gated);
	h = rmoe_hash_i64(h, c->dispatch);
	h = rmoe_hash_i64(h, c->dtype);
	h = rmoe_hash_i64(h, c->chunk_rows);
	h = rmoe_hash_i64(h, c->partitions > 1 ? c->partitions : 1);
	h = rmoe_hash_i64(h, rmoe_config_window(c));
	h = rmoe_hash_i64(h, c->stripes);
	h = rmoe_hash_i64(h, c->overlap);
	h = rmoe_hash_i64(h, c->deterministic);
	h = rmoe_hash_i64(h, c->mem_cap);
	/* The finite check adds a collective to every pass: ranks must agree. */
	h = rmoe_hash_i64(h, c->check_finite);
	return h;
}
