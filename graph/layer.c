/* The public layer's life: creation (collective checks, the plan, the
 * buffers it keeps and their handles) and destruction. Its two passes are
 * forward_backward.c's; its weights, gradients and statistics in and out,
 * layer_io.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_config.h"
#include "rmoe_alltoall.h"
#include "rmoe_dispatch.h"
#include "rmoe_plan.h"
#include "rmoe_system.h"

/* ---- buffers the layer keeps ----------------------------------------------------- */

/* Under simulation no kernel runs and the layer's large buffers hold no
 * meaning: they are folded (StarPU maps one small area over and over), so
 * that 64 simulated ranks fit in one host's memory. Small ones stay real:
 * the host writes and sends the synthetic expert counts. */
#ifdef STARPU_SIMGRID
#define FOLD_MIN_BYTES ((size_t)1 << 20)
#endif

void *rmoe_layer_alloc(int64_t n, size_t elsize)
{
	void *p = NULL;
	size_t bytes = (size_t)(n > 0 ? n : 1) * elsize;
#ifdef STARPU_SIMGRID
	if (bytes >= FOLD_MIN_BYTES)
		return starpu_malloc_flags(&p, bytes, STARPU_MALLOC_SIMULATION_FOLDED) == 0 ? p : NULL;
#endif
	if (posix_memalign(&p, 64, bytes) != 0)
		return NULL;
	return p;
}

void rmoe_layer_free_buffer(void *p, int64_t n, size_t elsize)
{
	if (!p)
		return;
#ifdef STARPU_SIMGRID
	size_t bytes = (size_t)(n > 0 ? n : 1) * elsize;
	if (bytes >= FOLD_MIN_BYTES) {
		starpu_free_flags(p, bytes, STARPU_MALLOC_SIMULATION_FOLDED);
		return;
	}
#else
	(void)n;
	(void)elsize;
#endif
	free(p);
}

/* The layer's kept buffers with their element counts and sizes, so that
 * allocation, registration and release walk one list. A buffer of one row
 * per token (per_token > 0: elements a token has) is allocated for the
 * capacity and registered for the tokens of the call, which change. */
struct kept {
	void **ptr;
	starpu_data_handle_t *handle;
	int64_t n;                /* elements; per token when per_token */
	int per_token;
	size_t elsize;
	int zeroed;               /* deterministic contents until the application sets its own */
};

static int kept_list(struct rmoe_layer *L, struct kept *k)
{
	const int64_t HE = L->H * L->E, WS = 3 * L->H * L->Fs;
	const int shared = L->Fs > 0;
	int n = 0;
#define KEEP(p, h, count, size, z) k[n++] = (struct kept){(void **)&(p), &(h), (count), 0, (size), (z)}
#define KEEP_ROWS(p, h, count, size, z) k[n++] = (struct kept){(void **)&(p), &(h), (count), 1, (size), (z)}
	KEEP(L->w_router, L->h_w_router, HE, sizeof(float), 1);
	KEEP(L->dw_router, L->h_dw_router, HE, sizeof(float), 1);
	/* Weights, their gradients and the saved input in the layer's element
	 * type; the router and the routing stay 4-byte. */
	KEEP(L->w_part, L->h_w_part, L->part_floats, L->act, 1);
	KEEP(L->dw_part, L->h_dw_part, L->part_floats, L->act, 1);
	if (shared) {
		KEEP(L->ws, L->h_ws, WS, L->act, 1);
		KEEP(L->dws, L->h_dws, WS, L->act, 1);
	}
	/* The shared expert's gate is replicated like the router: 4-byte. */
	if (shared && L->cfg.shared_gated) {
		KEEP(L->w_sgate, L->h_w_sgate, L->H, sizeof(float), 1);
		KEEP(L->dw_sgate, L->h_dw_sgate, L->H, sizeof(float), 1);
	}
	KEEP_ROWS(L->x_saved, L->h_x, L->H, L->act, 0);
	KEEP_ROWS(L->probs, L->h_probs, L->E, sizeof(float), 0);
	KEEP_ROWS(L->topk_idx, L->h_topk_idx, L->K, sizeof(int32_t), 0);
	KEEP_ROWS(L->topk_w, L->h_topk_w, L->K, sizeof(float), 0);
	KEEP_ROWS(L->dg, L->h_dg, L->K, sizeof(float), 1);
	KEEP_ROWS(L->pair_order, L->h_pair_order, L->K, sizeof(int32_t), 0);
	KEEP(L->expert_counts, L->h_counts, L->E, sizeof(int32_t), 0);
	if (L->traits->peer_counts)
		KEEP(L->peer_counts, L->h_peer_counts, L->E + L->N, sizeof(int32_t), 0);
#undef KEEP
#undef KEEP_ROWS
	return n;
}

/* Elements of kept buffer k for rows tokens. */
static int64_t kept_count(const struct kept *k, int64_t rows)
{
	return k->per_token ? k->n * rows : k->n;
}

/* The buffers' bytes as allocated: what the layer holds across calls. */
static int64_t kept_bytes(struct rmoe_layer *L)
{
	struct kept k[20];
	int n = kept_list(L, k);
	int64_t bytes = 0;
	for (int i = 0; i < n; i++)
		bytes += kept_count(&k[i], L->cap) * (int64_t)k[i].elsize;
	return bytes;
}

static void kept_unregister(struct kept *k)
{
	if (*k->handle) {
		starpu_data_unregister(*k->handle);
		*k->handle = NULL;
	}
}

static void kept_register(struct rmoe_layer *L, struct kept *k)
{
	*k->handle = rmoe_host_vector(NULL, *k->ptr, kept_count(k, L->T), k->elsize);
}

static void layer_free(struct rmoe_layer *L)
{
	struct kept k[20];
	int n = kept_list(L, k);
	for (int i = 0; i < n; i++) {
		kept_unregister(&k[i]);
		rmoe_layer_free_buffer(*k[i].ptr, kept_count(&k[i], L->cap), k[i].elsize);
	}
	free(L->expert_offsets);
	free(L->iota);
	free(L->tasks);
	free(L->rank_tokens);
	rmoe_a2a_plan_free(L->a2a);
	free(L->ring);
	free(L->stripe_count);
	free(L->stripes);
	free(L);
}

/* Allocates kept buffer k for L->cap tokens. */
static int kept_alloc(struct rmoe_layer *L, struct kept *k)
{
	const int64_t count = kept_count(k, L->cap);
	if (!(*k->ptr = rmoe_layer_alloc(count, k->elsize)))
		return -1;
	if (k->zeroed)
		memset(*k->ptr, 0, (size_t)(count > 0 ? count : 1) * k->elsize);
	return 0;
}

/* Allocates every kept buffer; registers them once all exist. */
static int layer_buffers(struct rmoe_layer *L)
{
	struct kept k[20];
	int n = kept_list(L, k), fail = 0;
	L->ring = malloc(sizeof(int) * (size_t)L->N);
	L->stripe_count = malloc(sizeof(int) * (size_t)L->N);
	L->stripes = malloc(sizeof(*L->stripes) * (size_t)L->N * RMOE_STRIPES_MAX);
	L->expert_offsets = calloc((size_t)L->E + 1, sizeof(int64_t));
	L->rank_tokens = calloc((size_t)L->N, sizeof(int64_t));
	fail = !L->ring || !L->stripe_count || !L->stripes || !L->expert_offsets || !L->rank_tokens;
	for (int i = 0; i < n; i++)
		fail |= kept_alloc(L, &k[i]) != 0;
	if (fail)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for the layer's buffers (tokens=%lld, hidden=%lld)",
		                  (long long)L->cap, (long long)L->H);
	for (int i = 0; i < n; i++)
		kept_register(L, &k[i]);
	for (int r = 0; r < L->N; r++)
		L->rank_tokens[r] = L->T;
	L->T_max = L->T;
	L->resident_bytes = kept_bytes(L);
	L->own = (struct rmoe_routing){L->h_pair_order, L->h_topk_w, L->h_dg, L->expert_offsets};
	return 0;
}

int rmoe_layer_resize(struct rmoe_layer *L, int64_t T, int64_t cap)
{
	if (T == L->T && cap <= L->cap)
		return 0;
	struct kept k[20];
	int n = kept_list(L, k), fail = 0;
	for (int i = 0; i < n; i++)
		if (k[i].per_token)
			kept_unregister(&k[i]);
	if (cap > L->cap) {
		/* Grown on every rank at once (every rank saw every count): the
		 * contents need not survive, a forward writes them all. */
		for (int i = 0; i < n; i++)
			if (k[i].per_token) {
				rmoe_layer_free_buffer(*k[i].ptr, kept_count(&k[i], L->cap), k[i].elsize);
				*k[i].ptr = NULL;
			}
		const int64_t old = L->cap;
		L->cap = cap;
		for (int i = 0; i < n; i++)
			if (k[i].per_token && kept_alloc(L, &k[i]))
				fail = 1;
		if (fail) {
			/* Back to a consistent layer: every buffer at its old room. */
			for (int i = 0; i < n; i++)
				if (k[i].per_token) {
					rmoe_layer_free_buffer(*k[i].ptr, kept_count(&k[i], L->cap), k[i].elsize);
					*k[i].ptr = NULL;
				}
			L->cap = old;
			for (int i = 0; i < n; i++)
				if (k[i].per_token)
					kept_alloc(L, &k[i]);
		}
		L->resident_bytes = kept_bytes(L);
	}
	if (!fail)
		L->T = T;
	for (int i = 0; i < n; i++)
		if (k[i].per_token)
			kept_register(L, &k[i]);
	L->own = (struct rmoe_routing){L->h_pair_order, L->h_topk_w, L->h_dg, L->expert_offsets};
	return fail ? rmoe_error(RMOE_ENOMEM, "out of host memory growing the layer's buffers to %lld tokens",
	                         (long long)cap)
	            : 0;
}

/* ---- creation ---------------------------------------------------------------------- */

/* The configuration, checked on every rank and compared across ranks; the
 * field that differs is named alike on every rank. */
static int check_same_config(rmoe_ctx *ctx, struct rmoe_wait *w, const struct rmoe_layer_config *cfg, int credits)
{
	/* The credits switch is compared with the configuration: a rank that
	 * sends none would leave its neighbour waiting for them. */
	int same = rmoe_agree_digest(w, ctx->comm, rmoe_config_hash(cfg) ^ (uint64_t)!credits,
	                             "comparing layer configurations");
	if (same != 0)
		return same < 0 ? same : 0;
	enum { NFIELDS = 18 };
	static const char *const names[NFIELDS] = {
		"hidden", "ffn", "experts", "topk", "tokens", "norm_topk", "shared_ffn", "shared_gated", "dispatch",
		"dtype", "chunk_rows", "overlap", "deterministic", "mem_cap", "check_finite", "partitions",
		"window", "flow credits (RMOE_FLOW_CREDITS)"};
	const int64_t mine[NFIELDS] = {
		cfg->hidden, cfg->ffn, cfg->experts, cfg->topk, cfg->tokens, cfg->norm_topk,
		cfg->shared_ffn, cfg->shared_gated, cfg->dispatch, cfg->dtype, cfg->chunk_rows, cfg->overlap,
		cfg->deterministic, cfg->mem_cap, cfg->check_finite, cfg->partitions > 1 ? cfg->partitions : 1,
		rmoe_config_window(cfg), credits};
	int64_t *all = malloc(sizeof(int64_t) * NFIELDS * (size_t)ctx->size);
	int mrc;
	if (all && (mrc = rmoe_allgather_bounded(w, mine, all, NFIELDS, MPI_INT64_T, ctx->comm,
	                                         "comparing layer configurations"))) {
		free(all);
		return mrc;
	}
	for (int r = 1; all && r < ctx->size; r++)
		for (int f = 0; f < NFIELDS; f++)
			if (all[(size_t)r * NFIELDS + f] != all[f]) {
				long long a = (long long)all[f], b = (long long)all[(size_t)r * NFIELDS + f];
				free(all);
				return rmoe_error(RMOE_EMISMATCH,
				                  "the layer configuration differs between ranks: %s = %lld on rank 0 "
				                  "but %lld on rank %d: every rank must pass the same one",
				                  names[f], a, b, r);
			}
	free(all);
	return rmoe_error(RMOE_EMISMATCH,
	                  "the layer configuration differs between ranks (this rank %d: hidden=%lld ffn=%lld "
	                  "experts=%lld topk=%lld tokens=%lld dispatch=%s): every rank must pass the same one",
	                  ctx->rank, (long long)cfg->hidden, (long long)cfg->ffn, (long long)cfg->experts,
	                  (long long)cfg->topk, (long long)cfg->tokens, rmoe_dispatch_name(cfg->dispatch));
}

/* The plan of this layer on the context's topology (scheduler/plan.c), made
 * on every rank from the same gathered data and compared once. Its
 * verdicts on the memory cap and on the fit are the same on every rank. */
static int plan_layer(rmoe_ctx *ctx, struct rmoe_wait *w, const struct rmoe_layer_config *cfg, struct rmoe_plan *plan)
{
	struct rmoe_device_info *devices = calloc((size_t)ctx->size, sizeof(*devices));
	int rc = devices ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory");
	if ((rc = rmoe_agree(w, ctx->comm, rc, "allocation")) || (rc = rmoe_discover_devices(ctx, w, devices))) {
		free(devices);
		return rc;
	}
	struct rmoe_plan_request req = {.layer = cfg, .devices = devices, .rank_order = ctx->ring_rank_order};
	/* The runtime's structures, which a cap holds beside the data: the
	 * largest any rank measured, so that every rank plans alike. */
	int64_t units[5], most[5];
	rmoe_bookkeeping_units(&units[0], &units[1], &units[2], &units[3], &units[4]);
	if ((rc = rmoe_allreduce_bounded(w, units, most, 5, MPI_INT64_T, MPI_MAX, ctx->comm, "the runtime's structures"))) {
		free(devices);
		return rc;
	}
	req.runtime = (struct rmoe_runtime_units){most[0], most[1], most[2], most[3], most[4]};
	rc = rmoe_agree_first(w, ctx->comm, rmoe_plan_make(&req, &ctx->topo, plan), "planning the layer");
	free(devices);
	if (rc)
		return rc;
	int same = rmoe_agree_digest(w, ctx->comm, rmoe_plan_digest(plan), "comparing the layer's plans");
	if (same <= 0)
		rc = same < 0 ? same
		              : rmoe_error(RMOE_EMISMATCH, "the ranks planned the layer differently: give every rank "
		                                           "the same cluster description");
	else if (plan->cap_rc)
		rc = rmoe_error(plan->cap_rc, "%s", plan->cap_msg);
	else if (plan->fit_rc)
		rc = rmoe_error(plan->fit_rc, "%s", plan->fit_msg);
	if (rc)
		rmoe_plan_free(plan);
	return rc;
}

/* RMOE_FLOW_CREDITS=off turns the relays' credits (flow.c) off: the
 * receive slots stay, so this is double buffering as it was before them,
 * early data included. It exists so that bench/flow/run.sh can measure what
 * the credits cost with one binary, interleaved; never for production. */
static int flow_credits_env(int *credits)
{
	const char *v = rmoe_env(RMOE_ENV_FLOW_CREDITS);
	*credits = 1;
	if (!v || !*v || !strcmp(v, "on") || !strcmp(v, "1"))
		return 0;
	if (!strcmp(v, "off") || !strcmp(v, "0")) {
		*credits = 0;
		return 0;
	}
	return rmoe_error(RMOE_EINVAL, "RMOE_FLOW_CREDITS='%s': expected on or off", v);
}

static struct rmoe_layer *layer_new(rmoe_ctx *ctx, const struct rmoe_layer_config *cfg,
                                    const struct rmoe_plan *plan, int credits)
{
	struct rmoe_layer *L = calloc(1, sizeof(*L));
	if (L && !(L->tasks = calloc(1, sizeof(*L->tasks)))) {
		free(L);
		L = NULL;
	}
	if (!L)
		return NULL;
	L->ctx = ctx;
	L->cfg = *cfg;
	L->cfg.dispatch = L->dispatch = plan->dispatch;
	L->traits = rmoe_dispatcher_of(plan->dispatch);
	L->ops = rmoe_dispatch_ops_of(plan->dispatch);
	L->cfg.chunk_rows = plan->chunk_rows;
	L->window = rmoe_config_window(cfg);
	L->flow_credits = credits;
	snprintf(L->dispatch_reason, sizeof(L->dispatch_reason), "%s", plan->dispatch_reason);
	L->H = cfg->hidden;
	L->F = cfg->ffn;
	L->E = cfg->experts;
	L->K = cfg->topk;
	L->T = L->cap = L->next_T = cfg->tokens;
	L->Fs = cfg->shared_ffn;
	L->N = ctx->size;
	L->e_local = L->E / L->N;
	L->first_expert = (int64_t)ctx->rank * L->e_local;
	L->part_floats = L->e_local * rmoe_expert_floats(L->H, L->F);
	L->act = cfg->dtype == RMOE_DTYPE_BF16 ? 2 : sizeof(float);
	return L;
}

int rmoe_layer_create(rmoe_layer **out, rmoe_ctx *ctx, const struct rmoe_layer_config *cfg)
{
	if (!out || !ctx || !cfg)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_create: layer, ctx and cfg must not be NULL");
	*out = NULL;
	struct rmoe_wait w = rmoe_wait_make(cfg->wait_timeout);
	int credits = 1;
	int rc = rmoe_config_check(cfg, ctx->size);
	if (!rc)
		rc = flow_credits_env(&credits);
#ifndef STARPU_SIMGRID
	const struct rmoe_dispatcher *row = rc ? NULL : rmoe_dispatcher_of(cfg->dispatch);
	if (row && row->cpu_tasks && starpu_cpu_worker_get_count() == 0)
		rc = rmoe_error(RMOE_ENOTSUP, "dispatch %s: its index tasks run on CPU workers and StarPU has "
		                "none here (STARPU_NCPU=0?): give it at least one", row->name);
#endif
	if ((rc = rmoe_agree_first(&w, ctx->comm, rc, "the layer configuration check")) ||
	    (rc = rmoe_agree(&w, ctx->comm, check_same_config(ctx, &w, cfg, credits), "the cross-rank configuration check")))
		return rc;
	struct rmoe_plan plan;
	if ((rc = plan_layer(ctx, &w, cfg, &plan)))
		return rc;
	if (rmoe_dispatcher_of(cfg->dispatch)->family == RMOE_FAMILY_CHOICE && ctx->verbose && ctx->rank == 0)
		fprintf(stderr, "relaymoe: dispatch auto -> %s: %s\n", rmoe_dispatch_name(plan.dispatch),
		        plan.dispatch_reason);
	struct rmoe_layer *L = layer_new(ctx, cfg, &plan, credits);
	rc = L ? layer_buffers(L) : rmoe_error(RMOE_ENOMEM, "out of host memory for the layer");
	if ((rc = rmoe_agree_first(&w, ctx->comm, rc, "allocation"))) {
		if (L)
			layer_free(L);
		rmoe_plan_free(&plan);
		return rc;
	}
	/* Neighbours come from the plan, not from rank +- 1. */
	memcpy(L->ring, plan.order, sizeof(int) * (size_t)L->N);
	memcpy(L->stripe_count, plan.stripe_count, sizeof(int) * (size_t)L->N);
	memcpy(L->stripes, plan.stripes, sizeof(*L->stripes) * (size_t)L->N * RMOE_STRIPES_MAX);
	L->striped = rmoe_ring_stripes_most(L->stripe_count, L->N) > 1;
	rmoe_plan_free(&plan);
	for (int i = 0; i < L->N; i++)
		if (L->ring[i] == ctx->rank)
			L->ring_pos = i;
	L->left = L->ring[(L->ring_pos - 1 + L->N) % L->N];
	L->right = L->ring[(L->ring_pos + 1) % L->N];
	ctx->nlayers++;
	*out = L;
	return 0;
}

int rmoe_layer_set_tokens(rmoe_layer *L, int64_t tokens)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_set_tokens: layer must not be NULL");
	if (tokens < 0)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_set_tokens: tokens = %lld: expected 0 or more",
		                  (long long)tokens);
	L->next_T = tokens;
	return 0;
}

int64_t rmoe_layer_tokens(const rmoe_layer *L)
{
	return L ? L->next_T : -1;
}

int rmoe_layer_destroy(rmoe_layer *L)
{
	if (!L)
		return 0;
	starpu_task_wait_for_all();
	L->ctx->nlayers--;
	layer_free(L);
	return 0;
}
