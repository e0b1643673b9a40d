/* The layer object behind the public API: creation (collective checks),
 * weights, forward and backward (router, shared expert, then the chosen
 * dispatch graph), and the helpers the graphs share. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "rmoe_config.h"
/* Not in the simulation: smpicc defines malloc as a macro, which <malloc.h>
 * cannot be read after; a simulated process's RSS means nothing anyway. */
#if defined(__GLIBC__) && !defined(RMOE_SIMGRID)
#include <malloc.h>
#endif

#include "rmoe_codelets.h"
#include "rmoe_graph.h"
#include "rmoe_memory_model.h"

/* ---- small helpers -------------------------------------------------------- */

/* Under simulation no kernel runs and the layer's large buffers hold no
 * meaning: they are folded (StarPU maps one small area over and over; under
 * SMPI, SMPI's shared malloc), so that 64 simulated ranks fit in one host's
 * memory. Small ones stay real: the host writes and sends the synthetic
 * expert counts. */
#ifdef STARPU_SIMGRID
#define FOLD_MIN_BYTES ((size_t)1 << 20)
#endif

static void *alloc_floats(int64_t n, size_t elsize)
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

static void free_floats(void *p, int64_t n, size_t elsize)
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

static starpu_data_handle_t reg_vector(void *ptr, int64_t n, size_t elsize)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptr, (uint32_t)n, elsize);
	return h;
}

starpu_data_handle_t rmoe_temp_vector(struct rmoe_pass *pass, int64_t n, size_t elsize)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, -1, 0, (uint32_t)n, elsize);
	int64_t bytes = n * (int64_t)elsize;
	if (bytes > pass->largest_temporary)
		pass->largest_temporary = bytes;
	return h;
}

starpu_data_handle_t rmoe_host_vector(struct rmoe_pass *pass, void *ptr, int64_t n, size_t elsize)
{
	pass->resident += n * (int64_t)elsize;
	return reg_vector(ptr, n, elsize);
}

int rmoe_send(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int dest,
              int64_t tag, int prio)
{
	int ret = starpu_mpi_isend_detached_prio(h, dest, tag, prio, L->ctx->comm, NULL, NULL);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_mpi_isend_detached to rank %d (tag %lld) failed (%d)",
		                  dest, (long long)tag, ret);
	pass->bytes_sent += (int64_t)starpu_data_get_size(h);
	return 0;
}

int rmoe_recv(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int src,
              int64_t tag)
{
	(void)pass;
	int ret = starpu_mpi_irecv_detached(h, src, tag, L->ctx->comm, NULL, NULL);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_mpi_irecv_detached from rank %d (tag %lld) failed (%d)",
		                  src, (long long)tag, ret);
	return 0;
}

/* ---- bounded waits (cfg.wait_timeout) -------------------------------------- */

/* A rank that dies leaves the others waiting for its data or its vote, and
 * with a launcher that does not end the job on a death (Open MPI's mpirun
 * does, by default), forever. With a timeout every wait of a collective call
 * polls instead and gives up with RMOE_EPEER. The timeout of the call under
 * way on this thread, set on entry by each collective function; 0 keeps the
 * plain blocking waits. */
static _Thread_local double wait_timeout;

static void wait_timeout_from(const struct rmoe_layer_config *cfg)
{
	wait_timeout = cfg->wait_timeout > 0 && isfinite(cfg->wait_timeout) ? cfg->wait_timeout : 0;
}

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Polls start at 20 us and double up to 1 ms: short waits stay short, long
 * ones cost little. */
static void poll_pause(long *ns)
{
	struct timespec ts = {0, *ns};
	nanosleep(&ts, NULL);
	if (*ns < 1000000)
		*ns *= 2;
}

static int peer_timeout(const char *what)
{
	return rmoe_error(RMOE_EPEER,
	                  "no progress for %g s (wait_timeout) while waiting for %s: another rank died, "
	                  "hangs or stopped calling the layer, or a task here cannot get memory (StarPU "
	                  "1.3 retries forever); this process must end (MPI_Abort)",
	                  wait_timeout, what);
}

struct acquire_flag {
	atomic_int done;
};

static void acquire_done(void *arg)
{
	atomic_store(&((struct acquire_flag *)arg)->done, 1);
}

/* starpu_data_acquire within the timeout. On RMOE_EPEER the flag is left to
 * the callback, which may still run. */
static int acquire_bounded_on(starpu_data_handle_t h, int node, enum starpu_data_access_mode mode,
                              const char *what)
{
	int ret;
	if (wait_timeout <= 0) {
		ret = starpu_data_acquire_on_node(h, node, mode);
		return ret ? rmoe_error(RMOE_ESTARPU, "starpu_data_acquire (%s) failed (%d)", what, ret) : 0;
	}
	struct acquire_flag *flag = calloc(1, sizeof(*flag));
	if (!flag)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	ret = starpu_data_acquire_on_node_cb(h, node, mode, acquire_done, flag);
	if (ret) {
		free(flag);
		return rmoe_error(RMOE_ESTARPU, "starpu_data_acquire_cb (%s) failed (%d)", what, ret);
	}
	double t0 = now_seconds();
	for (long ns = 20000; !atomic_load(&flag->done); poll_pause(&ns))
		if (now_seconds() - t0 > wait_timeout)
			return peer_timeout(what);
	free(flag);
	return 0;
}

static int acquire_bounded(starpu_data_handle_t h, enum starpu_data_access_mode mode, const char *what)
{
	return acquire_bounded_on(h, STARPU_MAIN_RAM, mode, what);
}

/* starpu_task_wait_for_all within the timeout. */
static int wait_tasks_bounded(const char *what)
{
	if (wait_timeout <= 0) {
		starpu_task_wait_for_all();
		return 0;
	}
	double t0 = now_seconds();
	for (long ns = 20000; starpu_task_nsubmitted() > 0; poll_pause(&ns))
		if (now_seconds() - t0 > wait_timeout)
			return peer_timeout(what);
	return 0;
}

/* Completes a non-blocking collective within the timeout. On RMOE_EPEER the
 * request is abandoned: it cannot complete without the missing rank. */
static int complete_bounded(int started, MPI_Request *req, const char *call, const char *what)
{
	if (started != MPI_SUCCESS)
		return rmoe_error(RMOE_EMPI, "%s failed while %s", call, what);
	double t0 = now_seconds();
	for (long ns = 20000;; poll_pause(&ns)) {
		int done = 0;
		if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
			return rmoe_error(RMOE_EMPI, "MPI_Test of %s failed while %s", call, what);
		if (done)
			return 0;
		if (now_seconds() - t0 > wait_timeout)
			return peer_timeout(what);
	}
}

/* MPI_Allreduce, MPI_Bcast and MPI_Allgather within the timeout: their
 * non-blocking forms, polled; the blocking ones without a timeout. */
static int allreduce_bounded(const void *in, void *out, int count, MPI_Datatype type, MPI_Op op,
                             MPI_Comm comm, const char *what)
{
	MPI_Request req;
	if (wait_timeout <= 0)
		return MPI_Allreduce(in, out, count, type, op, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Allreduce failed while %s", what);
	return complete_bounded(MPI_Iallreduce(in, out, count, type, op, comm, &req), &req,
	                        "MPI_Iallreduce", what);
}

static int bcast_bounded(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
                         const char *what)
{
	MPI_Request req;
	if (wait_timeout <= 0)
		return MPI_Bcast(buf, count, type, root, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Bcast failed while %s", what);
	return complete_bounded(MPI_Ibcast(buf, count, type, root, comm, &req), &req, "MPI_Ibcast", what);
}

static int allgather_bounded(const void *in, void *out, int count, MPI_Datatype type, MPI_Comm comm,
                             const char *what)
{
	MPI_Request req;
	if (wait_timeout <= 0)
		return MPI_Allgather(in, count, type, out, count, type, comm) == MPI_SUCCESS
		               ? 0
		               : rmoe_error(RMOE_EMPI, "MPI_Allgather failed while %s", what);
	return complete_bounded(MPI_Iallgather(in, count, type, out, count, type, comm, &req), &req,
	                        "MPI_Iallgather", what);
}

int rmoe_wait_data(starpu_data_handle_t h)
{
	int rc = acquire_bounded(h, STARPU_R, "data from another rank");
	if (rc)
		return rc;
	starpu_data_release(h);
	return 0;
}

int rmoe_exchange_counts(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, int32_t *all)
{
	const int N = L->N, me = L->ctx->rank;
	starpu_data_handle_t *hc = calloc((size_t)N, sizeof(*hc));
	if (!hc)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int rc = 0;
	for (int q = 0; q < N && !rc; q++) {
		if (q == me)
			continue;
		hc[q] = reg_vector(all + (int64_t)q * L->E, L->E, sizeof(int32_t));
		rc = rmoe_send(L, pass, L->h_counts, q, tag, 0);
		if (!rc)
			rc = rmoe_recv(L, pass, hc[q], q, tag);
	}
	/* Unregistering waits for each receive; a bounded wait first, so that a
	 * dead peer gives RMOE_EPEER (its handle is then left registered). */
	for (int q = 0; q < N; q++)
		if (hc[q] && !rc) {
			int wrc = rmoe_wait_data(hc[q]);
			if (wrc == RMOE_EPEER) {
				free(hc);
				return wrc;
			}
			rc = wrc;
		}
	for (int q = 0; q < N; q++)
		if (hc[q])
			starpu_data_unregister(hc[q]);
	free(hc);
	if (rc)
		return rc;
	memcpy(all + (int64_t)me * L->E, L->expert_counts, (size_t)L->E * sizeof(int32_t));
#ifdef STARPU_SIMGRID
	/* What was sent is synthetic; each rank draws every rank's counts
	 * itself, so the plans agree whatever the transfers carried. */
	for (int q = 0; q < N; q++)
		rmoe_sim_expert_counts(L->T, L->K, L->E, q, all + (int64_t)q * L->E);
#endif
	return 0;
}

/* ---- chunks of a partition's pairs ------------------------------------------ */

int64_t rmoe_partition_chunks(const struct rmoe_layer *L, const int64_t *offsets, int p,
                              int64_t max_rows, struct rmoe_chunk **chunks)
{
	int64_t e0 = (int64_t)p * L->e_local;
	int64_t first = rmoe_pairs_first(offsets, e0);
	int64_t total = rmoe_pairs_count(offsets, e0, L->e_local);
	*chunks = NULL;
	if (total == 0)
		return 0;
	if (max_rows <= 0 || max_rows > total)
		max_rows = total;
	int64_t n = (total + max_rows - 1) / max_rows;
	struct rmoe_chunk *c = calloc((size_t)n, sizeof(*c));
	if (!c)
		return -1;
	for (int64_t i = 0; i < n; i++) {
		c[i].first = first + i * max_rows;
		c[i].rows = (i == n - 1) ? total - i * max_rows : max_rows;
		c[i].rows_per_expert = calloc((size_t)L->e_local, sizeof(int64_t));
		if (!c[i].rows_per_expert) {
			rmoe_chunks_free(c, i);
			return -1;
		}
		int64_t lo = c[i].first, hi = c[i].first + c[i].rows;
		for (int64_t e = 0; e < L->e_local; e++) {
			int64_t a = offsets[e0 + e], b = offsets[e0 + e + 1];
			int64_t s = a > lo ? a : lo, t = b < hi ? b : hi;
			c[i].rows_per_expert[e] = t > s ? t - s : 0;
		}
	}
	*chunks = c;
	return n;
}

void rmoe_chunks_free(struct rmoe_chunk *chunks, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		free(chunks[i].rows_per_expert);
	free(chunks);
}

/* ---- creation ---------------------------------------------------------------- */

/* Every rank learns whether every rank succeeded: no rank proceeds (and
 * hangs later in a collective) while another has failed. */
static int agree(rmoe_ctx *ctx, int rc, const char *what)
{
	/* A peer already missing would only make the vote wait again. */
	if (rc == RMOE_EPEER)
		return rc;
	int worst = rc;
	int mrc = allreduce_bounded(&rc, &worst, 1, MPI_INT, MPI_MIN, ctx->comm, what);
	if (mrc)
		return mrc;
	if (rc != 0)
		return rc;
	if (worst != 0)
		return rmoe_error(worst, "another rank failed %s: %s", what, rmoe_strerror(worst));
	return 0;
}

/* As agree, and every rank returns the same code and message: those of the
 * lowest failing rank, prefixed with its number, so that a bad value one
 * rank found is named on all of them. */
static int agree_first(rmoe_ctx *ctx, int rc, const char *what)
{
	if (rc == RMOE_EPEER)
		return rc;
	int mine = rc ? ctx->rank : ctx->size, first = mine;
	int mrc = allreduce_bounded(&mine, &first, 1, MPI_INT, MPI_MIN, ctx->comm, what);
	if (mrc)
		return mrc;
	if (first == ctx->size)
		return 0;
	struct {
		int code;
		char msg[400];
	} verdict;
	memset(&verdict, 0, sizeof(verdict));
	if (first == ctx->rank) {
		verdict.code = rc;
		snprintf(verdict.msg, sizeof(verdict.msg), "%s", rmoe_strerror(rc));
	}
	mrc = bcast_bounded(&verdict, (int)sizeof(verdict), MPI_BYTE, first, ctx->comm, what);
	if (mrc)
		return mrc;
	verdict.msg[sizeof(verdict.msg) - 1] = '\0';
	return rmoe_error(verdict.code, "rank %d: %s", first, verdict.msg);
}

static int check_same_config(rmoe_ctx *ctx, const struct rmoe_layer_config *cfg)
{
	uint64_t h = rmoe_config_hash(cfg), lo = h, hi = h;
	int mrc = allreduce_bounded(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, ctx->comm,
	                            "comparing layer configurations");
	if (!mrc)
		mrc = allreduce_bounded(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, ctx->comm,
		                        "comparing layer configurations");
	if (mrc)
		return mrc;
	if (lo == hi)
		return 0;
	/* Every rank is here: gather the fields to name the first that differs,
	 * so that all ranks report the same field and values. */
	enum { NFIELDS = 14 };
	static const char *const names[NFIELDS] = {
		"hidden", "ffn", "experts", "topk", "tokens", "norm_topk", "shared_ffn", "dispatch",
		"dtype", "chunk_rows", "overlap", "deterministic", "mem_cap", "check_finite"};
	const int64_t mine[NFIELDS] = {
		cfg->hidden, cfg->ffn, cfg->experts, cfg->topk, cfg->tokens, cfg->norm_topk,
		cfg->shared_ffn, cfg->dispatch, cfg->dtype, cfg->chunk_rows, cfg->overlap,
		cfg->deterministic, cfg->mem_cap, cfg->check_finite};
	int64_t *all = malloc(sizeof(int64_t) * NFIELDS * (size_t)ctx->size);
	if (all && (mrc = allgather_bounded(mine, all, NFIELDS, MPI_INT64_T, ctx->comm,
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
	                  "the layer configuration differs between ranks (this rank %d: hidden=%lld "
	                  "ffn=%lld experts=%lld topk=%lld tokens=%lld dispatch=%s): every rank must "
	                  "pass the same one",
	                  ctx->rank, (long long)cfg->hidden, (long long)cfg->ffn,
	                  (long long)cfg->experts, (long long)cfg->topk, (long long)cfg->tokens,
	                  rmoe_dispatch_name(cfg->dispatch));
}

static void layer_free(struct rmoe_layer *L)
{
	starpu_data_handle_t *hs[] = {&L->h_w_router, &L->h_dw_router, &L->h_w_part, &L->h_dw_part,
	                              &L->h_ws, &L->h_dws, &L->h_x, &L->h_probs, &L->h_topk_idx,
	                              &L->h_topk_w, &L->h_dg, &L->h_pair_order, &L->h_counts};
	for (unsigned i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
		if (*hs[i]) {
			starpu_data_unregister(*hs[i]);
			*hs[i] = NULL;
		}
	const int64_t HE = L->H * L->E, TK = L->T * L->K, WS = 3 * L->H * L->Fs;
	free_floats(L->w_router, HE, sizeof(float));
	free_floats(L->dw_router, HE, sizeof(float));
	free_floats(L->w_part, L->part_floats, sizeof(float));
	free_floats(L->dw_part, L->part_floats, sizeof(float));
	free_floats(L->ws, WS, sizeof(float));
	free_floats(L->dws, WS, sizeof(float));
	free_floats(L->x_saved, L->T * L->H, sizeof(float));
	free_floats(L->probs, L->T * L->E, sizeof(float));
	free_floats(L->topk_w, TK, sizeof(float));
	free_floats(L->dg, TK, sizeof(float));
	free_floats(L->topk_idx, TK, sizeof(int32_t));
	free_floats(L->pair_order, TK, sizeof(int32_t));
	free_floats(L->expert_counts, L->E, sizeof(int32_t));
	free(L->expert_offsets);
	free(L->ring);
	free(L);
}

/* Memory cap: the chunk size from the memory model, for any routing (a chunk
 * bounds a hop's rows whatever the skew). Smaller chunks the user asked for
 * are kept. */
/* RMOE_DISPATCH_AUTO (§3.2): the mode with less exposed communication per
 * hop over the planned ring's slowest edge, from Table 2's volumes. A pure
 * function of the configuration and the ring: every rank picks the same. */
static enum rmoe_dispatch choose_dispatch(const rmoe_ctx *ctx, const struct rmoe_layer_config *cfg,
                                          char *reason, size_t len)
{
	snprintf(reason, len, "%s requested", rmoe_dispatch_name(cfg->dispatch));
	if (cfg->dispatch != RMOE_DISPATCH_AUTO)
		return cfg->dispatch;
	struct rmoe_routing_problem p = {.hidden = cfg->hidden, .ffn = cfg->ffn, .experts = cfg->experts,
	                                 .topk = cfg->topk, .tokens = cfg->tokens, .ep = ctx->size,
	                                 .etp = 1, .dtype = cfg->dtype};
	struct rmoe_routing_choice choice;
	if (rmoe_routing_choose(&p, ctx->edges, ctx->size, ctx->device_tflops, &choice) != 0) {
		snprintf(reason, len, "expert routing (the routing choice failed: %s)",
		         rmoe_last_error_message());
		return RMOE_DISPATCH_RING_EXPERT;
	}
	snprintf(reason, len, "%s", choice.reason);
	return choice.mode;
}

/* The memory limit of this process's cgroup (v2, then v1), as a batch
 * system sets it for a job; -1 when there is none. */
static double cgroup_limit(void)
{
	static const char *const files[] = {"/sys/fs/cgroup/memory.max",
	                                    "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
	for (unsigned i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		FILE *f = fopen(files[i], "r");
		if (!f)
			continue;
		unsigned long long v;
		int got = fscanf(f, "%llu", &v);
		fclose(f);
		/* "max", or v1's "unlimited" (a number near 2^63) */
		if (got == 1 && v < (1ULL << 60))
			return (double)v;
	}
	return -1;
}

/* Bytes this rank can hold: the node's memory (or its cgroup's limit)
 * shared by its ranks, and what the address-space limit (ulimit -v) leaves;
 * -1 when none is known. */
static double memory_available(const rmoe_ctx *ctx, char *why, size_t len)
{
	double avail = -1;
	const int ranks = ctx->local_size > 0 ? ctx->local_size : 1;
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	if (pages > 0 && page > 0) {
		avail = (double)pages * (double)page / ranks;
		snprintf(why, len, "the node's %.1f GiB of memory shared by its %d rank(s)",
		         (double)pages * (double)page / 1073741824.0, ranks);
	}
	double cg = cgroup_limit();
	if (cg >= 0 && (avail < 0 || cg / ranks < avail)) {
		avail = cg / ranks;
		snprintf(why, len, "the job's cgroup memory limit of %.1f GiB shared by %d rank(s)",
		         cg / 1073741824.0, ranks);
	}
	struct rlimit rl;
	if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
		long long vm_pages = 0;
		FILE *f = fopen("/proc/self/statm", "r");
		if (f) {
			if (fscanf(f, "%lld", &vm_pages) != 1)
				vm_pages = 0;
			fclose(f);
		}
		double left = (double)rl.rlim_cur - (double)vm_pages * (double)(page > 0 ? page : 4096);
		if (left < 0)
			left = 0;
		if (avail < 0 || left < avail) {
			avail = left;
			snprintf(why, len, "%.2f GiB of address space left under its limit (ulimit -v)",
			         left / 1073741824.0);
		}
	}
	return avail;
}

/* A layer that cannot fit fails here, on every rank, with what it needs:
 * not later in a StarPU allocation, which 1.3 retries forever, or at the
 * hands of the kernel's out-of-memory killer once pages are touched. The
 * model's estimate with even routing is a lower bound of what a pass
 * holds, so a refusal is never spurious. */
static int check_fits(const rmoe_ctx *ctx, const struct rmoe_layer_config *cfg, int64_t chunk_rows)
{
	struct rmoe_mem_config mc;
	rmoe_mem_config_from_layer(&mc, cfg, ctx->size);
	mc.chunk_rows = chunk_rows;
	struct rmoe_mem_estimate est;
	if (rmoe_memory_model(cfg->dispatch, &mc, &est) != 0)
		return 0;
	char why[160] = "";
	double avail = memory_available(ctx, why, sizeof(why));
	if (avail < 0 || (double)est.peak <= avail)
		return 0;
	const double GiB = 1073741824.0;
	return rmoe_error(RMOE_ENOMEM,
	                  "the layer needs at least %.2f GiB on each rank (memory model, %s dispatch: "
	                  "%.2f GiB resident, the rest a pass's temporaries) but this rank has %.2f GiB "
	                  "(%s): expected fewer tokens per rank, a smaller layer or more ranks",
	                  (double)est.peak / GiB, rmoe_dispatch_name(cfg->dispatch),
	                  (double)est.resident_backward / GiB, avail / GiB, why);
}

static int cap_chunks(const struct rmoe_layer_config *cfg, int nranks, int64_t *chunk_rows)
{
	if (cfg->mem_cap <= 0)
		return 0;
	struct rmoe_mem_config mc;
	rmoe_mem_config_from_layer(&mc, cfg, nranks);
	mc.chunk_rows = 0;
	mc.skew = nranks;
	int64_t c;
	int rc = rmoe_memory_cap_chunk(cfg->dispatch, &mc, cfg->mem_cap, &c);
	if (rc)
		return rc;
	if (*chunk_rows <= 0 || *chunk_rows > c)
		*chunk_rows = c;
	return 0;
}

int rmoe_layer_create(rmoe_layer **out, rmoe_ctx *ctx, const struct rmoe_layer_config *cfg)
{
	if (!out || !ctx || !cfg)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_create: layer, ctx and cfg must not be NULL");
	*out = NULL;
	wait_timeout_from(cfg);
#ifdef STARPU_USE_CUDA
	int have_cuda = starpu_cuda_worker_get_count() > 0;
#else
	int have_cuda = 0;
#endif
	int rc = rmoe_config_check(cfg, ctx->size, have_cuda);
	if ((rc = agree_first(ctx, rc, "the layer configuration check")))
		return rc;
	if ((rc = agree(ctx, check_same_config(ctx, cfg), "the cross-rank configuration check")))
		return rc;
	struct rmoe_layer_config resolved = *cfg;
	char reason[384];
	resolved.dispatch = choose_dispatch(ctx, cfg, reason, sizeof(reason));
	int64_t chunk_rows = cfg->chunk_rows;
	if ((rc = agree_first(ctx, cap_chunks(&resolved, ctx->size, &chunk_rows), "the memory cap")))
		return rc;
	if ((rc = agree_first(ctx, check_fits(ctx, &resolved, chunk_rows), "the memory check")))
		return rc;
	if (cfg->dispatch == RMOE_DISPATCH_AUTO && ctx->verbose && ctx->rank == 0)
		fprintf(stderr, "relaymoe: dispatch auto -> %s: %s\n", rmoe_dispatch_name(resolved.dispatch),
		        reason);

	struct rmoe_layer *L = calloc(1, sizeof(*L));
	if (!L)
		return agree_first(ctx, rmoe_error(RMOE_ENOMEM, "out of host memory for the layer"), "allocation");
	L->ctx = ctx;
	L->cfg = resolved;
	L->dispatch = resolved.dispatch;
	snprintf(L->dispatch_reason, sizeof(L->dispatch_reason), "%s", reason);
	L->H = cfg->hidden;
	L->F = cfg->ffn;
	L->E = cfg->experts;
	L->K = cfg->topk;
	L->T = cfg->tokens;
	L->Fs = cfg->shared_ffn;
	L->N = ctx->size;
	L->e_local = L->E / L->N;
	L->first_expert = (int64_t)ctx->rank * L->e_local;
	L->part_floats = L->e_local * rmoe_expert_floats(L->H, L->F);
	L->cfg.chunk_rows = chunk_rows;

	L->ring = malloc(sizeof(int) * (size_t)L->N);
	int64_t TK = L->T * L->K, HE = L->H * L->E;
	L->w_router = alloc_floats(HE, sizeof(float));
	L->dw_router = alloc_floats(HE, sizeof(float));
	L->w_part = alloc_floats(L->part_floats, sizeof(float));
	L->dw_part = alloc_floats(L->part_floats, sizeof(float));
	if (L->Fs > 0) {
		L->ws = alloc_floats(3 * L->H * L->Fs, sizeof(float));
		L->dws = alloc_floats(3 * L->H * L->Fs, sizeof(float));
	}
	L->x_saved = alloc_floats(L->T * L->H, sizeof(float));
	L->probs = alloc_floats(L->T * L->E, sizeof(float));
	L->topk_w = alloc_floats(TK, sizeof(float));
	L->dg = alloc_floats(TK, sizeof(float));
	L->topk_idx = alloc_floats(TK, sizeof(int32_t));
	L->pair_order = alloc_floats(TK, sizeof(int32_t));
	L->expert_counts = alloc_floats(L->E, sizeof(int32_t));
	L->expert_offsets = calloc((size_t)L->E + 1, sizeof(int64_t));
	int fail = !L->ring || !L->w_router || !L->dw_router || !L->w_part || !L->dw_part ||
	           (L->Fs > 0 && (!L->ws || !L->dws)) || !L->x_saved || !L->probs || !L->topk_w ||
	           !L->dg || !L->topk_idx || !L->pair_order || !L->expert_counts || !L->expert_offsets;
	rc = fail ? rmoe_error(RMOE_ENOMEM,
	                       "out of host memory for the layer's buffers (tokens=%lld, hidden=%lld)",
	                       (long long)L->T, (long long)L->H)
	          : 0;
	if ((rc = agree_first(ctx, rc, "allocation"))) {
		layer_free(L);
		return rc;
	}
	/* Neighbours come from the context's plan, not from rank +- 1. */
	memcpy(L->ring, ctx->ring, sizeof(int) * (size_t)L->N);
	for (int i = 0; i < L->N; i++)
		if (L->ring[i] == ctx->rank)
			L->ring_pos = i;
	L->left = L->ring[(L->ring_pos - 1 + L->N) % L->N];
	L->right = L->ring[(L->ring_pos + 1) % L->N];

	/* Deterministic contents until the application sets its own. */
	memset(L->w_router, 0, (size_t)HE * sizeof(float));
	memset(L->w_part, 0, (size_t)L->part_floats * sizeof(float));
	memset(L->dw_part, 0, (size_t)L->part_floats * sizeof(float));
	memset(L->dw_router, 0, (size_t)HE * sizeof(float));
	memset(L->dg, 0, (size_t)TK * sizeof(float));
	if (L->Fs > 0) {
		memset(L->ws, 0, (size_t)(3 * L->H * L->Fs) * sizeof(float));
		memset(L->dws, 0, (size_t)(3 * L->H * L->Fs) * sizeof(float));
	}

	L->h_w_router = reg_vector(L->w_router, HE, sizeof(float));
	L->h_dw_router = reg_vector(L->dw_router, HE, sizeof(float));
	L->h_w_part = reg_vector(L->w_part, L->part_floats, sizeof(float));
	L->h_dw_part = reg_vector(L->dw_part, L->part_floats, sizeof(float));
	if (L->Fs > 0) {
		L->h_ws = reg_vector(L->ws, 3 * L->H * L->Fs, sizeof(float));
		L->h_dws = reg_vector(L->dws, 3 * L->H * L->Fs, sizeof(float));
	}
	L->h_x = reg_vector(L->x_saved, L->T * L->H, sizeof(float));
	L->h_probs = reg_vector(L->probs, L->T * L->E, sizeof(float));
	L->h_topk_idx = reg_vector(L->topk_idx, TK, sizeof(int32_t));
	L->h_topk_w = reg_vector(L->topk_w, TK, sizeof(float));
	L->h_dg = reg_vector(L->dg, TK, sizeof(float));
	L->h_pair_order = reg_vector(L->pair_order, TK, sizeof(int32_t));
	L->h_counts = reg_vector(L->expert_counts, L->E, sizeof(int32_t));
	L->own = (struct rmoe_routing){L->h_pair_order, L->h_topk_w, L->h_dg, L->expert_offsets};

	L->resident_bytes = (int64_t)sizeof(float) * (2 * HE + 2 * L->part_floats +
	                                              (L->Fs > 0 ? 6 * L->H * L->Fs : 0) +
	                                              L->T * L->H + L->T * L->E + 2 * TK) +
	                    (int64_t)sizeof(int32_t) * (2 * TK + L->E);
	ctx->nlayers++;
	*out = L;
	return 0;
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

int rmoe_layer_owned_experts(const rmoe_layer *L, int64_t *first, int64_t *count)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "layer is NULL");
	if (first)
		*first = L->first_expert;
	if (count)
		*count = L->e_local;
	return 0;
}

enum rmoe_dispatch rmoe_layer_dispatch(const rmoe_layer *L)
{
	return L ? L->dispatch : RMOE_DISPATCH_ALLTOALL;
}

const char *rmoe_layer_dispatch_reason(const rmoe_layer *L)
{
	return L ? L->dispatch_reason : "";
}

/* ---- weights and gradients ----------------------------------------------------- */

/* Copy between host memory and a registered buffer, waiting for the tasks
 * and transfers that use it. */
static int copy_handle(starpu_data_handle_t h, void *dst, const void *src, size_t bytes, int write)
{
	int ret = starpu_data_acquire(h, write ? STARPU_W : STARPU_R);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_data_acquire failed (%d)", ret);
	memcpy(dst, src, bytes);
	starpu_data_release(h);
	return 0;
}

static int check_owned(const rmoe_layer *L, int64_t e)
{
	if (e < L->first_expert || e >= L->first_expert + L->e_local)
		return rmoe_error(RMOE_EINVAL,
		                  "expert %lld is not owned by rank %d: expected %lld <= e < %lld",
		                  (long long)e, L->ctx->rank, (long long)L->first_expert,
		                  (long long)(L->first_expert + L->e_local));
	return 0;
}

/* Partition layout: gate [n][H][F] | up [n][H][F] | down [n][F][H]. */
static int expert_io(const rmoe_layer *L, starpu_data_handle_t h, float *part, int64_t e, float *g,
                     float *u, float *d, int write)
{
	int rc = check_owned(L, e);
	if (rc)
		return rc;
	if (!g || !u || !d)
		return rmoe_error(RMOE_EINVAL, "expert %lld: gate, up and down pointers must not be NULL",
		                  (long long)e);
	int64_t le = e - L->first_expert, hf = L->H * L->F, n = L->e_local;
	float *pg = part + le * hf, *pu = part + n * hf + le * hf, *pd = part + 2 * n * hf + le * hf;
	int ret = starpu_data_acquire(h, write ? STARPU_RW : STARPU_R);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_data_acquire failed (%d)", ret);
	size_t bytes = (size_t)hf * sizeof(float);
	if (write) {
		memcpy(pg, g, bytes);
		memcpy(pu, u, bytes);
		memcpy(pd, d, bytes);
	} else {
		memcpy(g, pg, bytes);
		memcpy(u, pu, bytes);
		memcpy(d, pd, bytes);
	}
	starpu_data_release(h);
	return 0;
}

int rmoe_layer_set_router(rmoe_layer *L, const float *w)
{
	if (!L || !w)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_set_router: layer and weights must not be NULL");
	return copy_handle(L->h_w_router, L->w_router, w, (size_t)(L->H * L->E) * sizeof(float), 1);
}

int rmoe_layer_get_router(const rmoe_layer *L, float *w)
{
	if (!L || !w)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_get_router: layer and output must not be NULL");
	return copy_handle(L->h_w_router, w, L->w_router, (size_t)(L->H * L->E) * sizeof(float), 0);
}

int rmoe_layer_set_expert(rmoe_layer *L, int64_t e, const float *g, const float *u, const float *d)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "layer is NULL");
	return expert_io(L, L->h_w_part, L->w_part, e, (float *)g, (float *)u, (float *)d, 1);
}

int rmoe_layer_get_expert(const rmoe_layer *L, int64_t e, float *g, float *u, float *d)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "layer is NULL");
	return expert_io(L, L->h_w_part, L->w_part, e, g, u, d, 0);
}

int rmoe_layer_get_grad_expert(const rmoe_layer *L, int64_t e, float *g, float *u, float *d)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "layer is NULL");
	return expert_io(L, L->h_dw_part, L->dw_part, e, g, u, d, 0);
}

static int shared_io(const rmoe_layer *L, starpu_data_handle_t h, float *buf, float *g, float *u,
                     float *d, int write)
{
	if (L->Fs <= 0)
		return rmoe_error(RMOE_ESTATE, "the layer has no shared expert (shared_ffn = 0)");
	if (!g || !u || !d)
		return rmoe_error(RMOE_EINVAL, "shared expert: gate, up and down must not be NULL");
	size_t bytes = (size_t)(L->H * L->Fs) * sizeof(float);
	int ret = starpu_data_acquire(h, write ? STARPU_RW : STARPU_R);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_data_acquire failed (%d)", ret);
	float *p[3] = {buf, buf + L->H * L->Fs, buf + 2 * L->H * L->Fs};
	float *q[3] = {g, u, d};
	for (int i = 0; i < 3; i++)
		memcpy(write ? p[i] : q[i], write ? q[i] : p[i], bytes);
	starpu_data_release(h);
	return 0;
}

int rmoe_layer_set_shared(rmoe_layer *L, const float *g, const float *u, const float *d)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "layer is NULL");
	int rc = shared_io(L, L->h_ws, L->ws, (float *)g, (float *)u, (float *)d, 1);
	if (!rc)
		L->have_shared_weights = 1;
	return rc;
}

int rmoe_layer_get_grad_shared(const rmoe_layer *L, float *g, float *u, float *d)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "layer is NULL");
	return shared_io(L, L->h_dws, L->dws, g, u, d, 0);
}

int rmoe_layer_get_grad_router(const rmoe_layer *L, float *dw)
{
	if (!L || !dw)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_get_grad_router: layer and output must not be NULL");
	return copy_handle(L->h_dw_router, dw, L->dw_router, (size_t)(L->H * L->E) * sizeof(float), 0);
}

int rmoe_layer_get_routing(const rmoe_layer *L, int32_t *idx, float *w, float *probs)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "layer is NULL");
	if (!L->have_forward)
		return rmoe_error(RMOE_ESTATE, "no forward has run on this layer yet");
	int rc = 0;
	size_t tk = (size_t)(L->T * L->K);
	if (idx && !rc)
		rc = copy_handle(L->h_topk_idx, idx, L->topk_idx, tk * sizeof(int32_t), 0);
	if (w && !rc)
		rc = copy_handle(L->h_topk_w, w, L->topk_w, tk * sizeof(float), 0);
	if (probs && !rc)
		rc = copy_handle(L->h_probs, probs, L->probs, (size_t)(L->T * L->E) * sizeof(float), 0);
	return rc;
}

int rmoe_layer_get_stats(const rmoe_layer *L, struct rmoe_layer_stats *s)
{
	if (!L || !s)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_get_stats: layer and stats must not be NULL");
	*s = L->stats;
	return 0;
}

/* ---- finite checks ------------------------------------------------------------ */

/* The first NaN or infinity of a rows x cols tensor, named with its index. */
static int scan_finite(const float *v, int64_t rows, int64_t cols, const char *name, const char *note)
{
	const int64_t n = rows * cols;
	for (int64_t i = 0; i < n; i++)
		if (!isfinite(v[i]))
			return rmoe_error(RMOE_ENONFINITE, "%s[%lld, %lld] = %g%s: expected finite values",
			                  name, (long long)(i / cols), (long long)(i % cols), (double)v[i], note);
	return 0;
}

/* This rank's part of the finite check: the given inputs, then (weights) the
 * router, the owned experts and the shared expert. */
static int find_nonfinite(struct rmoe_layer *L, const float *x, const float *dy, const float *dprobs,
                          int weights)
{
	char rows[80];
	snprintf(rows, sizeof(rows), " (row of this rank's %lld tokens)", (long long)L->T);
	int rc = 0;
	if ((x && (rc = scan_finite(x, L->T, L->H, "x", rows))) ||
	    (dy && (rc = scan_finite(dy, L->T, L->H, "dy", rows))) ||
	    (dprobs && (rc = scan_finite(dprobs, L->T, L->E, "dprobs", rows))) || !weights)
		return rc;
	if ((rc = acquire_bounded(L->h_w_router, STARPU_R, "the router weights")))
		return rc;
	rc = scan_finite(L->w_router, L->H, L->E, "w_router", "");
	starpu_data_release(L->h_w_router);
	if (rc || (rc = acquire_bounded(L->h_w_part, STARPU_R, "the expert weights")))
		return rc;
	const int64_t hf = L->H * L->F, n = L->e_local;
	for (int64_t le = 0; le < n && !rc; le++) {
		char name[3][48];
		const int64_t e = L->first_expert + le;
		snprintf(name[0], sizeof(name[0]), "w_gate[%lld]", (long long)e);
		snprintf(name[1], sizeof(name[1]), "w_up[%lld]", (long long)e);
		snprintf(name[2], sizeof(name[2]), "w_down[%lld]", (long long)e);
		if (!(rc = scan_finite(L->w_part + le * hf, L->H, L->F, name[0], "")) &&
		    !(rc = scan_finite(L->w_part + (n + le) * hf, L->H, L->F, name[1], "")))
			rc = scan_finite(L->w_part + (2 * n + le) * hf, L->F, L->H, name[2], "");
	}
	starpu_data_release(L->h_w_part);
	if (rc || L->Fs <= 0 || !L->have_shared_weights ||
	    (rc = acquire_bounded(L->h_ws, STARPU_R, "the shared expert weights")))
		return rc;
	const int64_t hs = L->H * L->Fs;
	if (!(rc = scan_finite(L->ws, L->H, L->Fs, "w_shared_gate", "")) &&
	    !(rc = scan_finite(L->ws + hs, L->H, L->Fs, "w_shared_up", "")))
		rc = scan_finite(L->ws + 2 * hs, L->Fs, L->H, "w_shared_down", "");
	starpu_data_release(L->h_ws);
	return rc;
}

int rmoe_layer_check_finite(rmoe_layer *L, const float *x, const float *dy)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_check_finite: layer must not be NULL");
	wait_timeout_from(&L->cfg);
	return agree_first(L->ctx, find_nonfinite(L, x, dy, NULL, 1), "the finite check");
}

/* ---- forward and backward ------------------------------------------------------ */

/* Process peak RSS since the last reset: VmHWM, which writing "5" to
 * /proc/self/clear_refs resets (Linux >= 4.0), so each pass reports its own
 * peak even after a larger one in the same process; getrusage otherwise. */
static void rss_reset(void)
{
#if defined(__GLIBC__) && !defined(RMOE_SIMGRID)
	/* Freed heap pages of an earlier pass still count in RSS until trimmed. */
	malloc_trim(0);
#endif
	FILE *f = fopen("/proc/self/clear_refs", "w");
	if (f) {
		fputs("5", f);
		fclose(f);
	}
}

static int64_t peak_rss_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long long kib = -1;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %lld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	if (kib >= 0)
		return (int64_t)kib * 1024;
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return -1;
	return (int64_t)ru.ru_maxrss * 1024;
}

static int submit_router_fwd(struct rmoe_layer *L)
{
	struct rmoe_router_args *a = malloc(sizeof(*a));
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	*a = (struct rmoe_router_args){L->T, L->H, L->E, L->K, L->cfg.norm_topk};
	int ret = starpu_task_insert(&rmoe_cl_router_fwd, STARPU_R, L->h_x, STARPU_R, L->h_w_router,
	                             STARPU_W, L->h_probs, STARPU_W, L->h_topk_idx, STARPU_W, L->h_topk_w,
	                             STARPU_CL_ARGS, a, sizeof(*a), STARPU_PRIORITY,
	                             rmoe_clamp_prio(starpu_sched_get_max_priority()), STARPU_FLOPS,
	                             rmoe_flops_router(L->T, L->H, L->E), STARPU_NAME, "router-fwd", 0);
	if (ret)
		return rmoe_insert_failed("router-fwd", ret);
	struct rmoe_dispatch_map_args *m = malloc(sizeof(*m));
	if (!m)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	*m = (struct rmoe_dispatch_map_args){L->T, L->K, L->E};
	ret = starpu_task_insert(&rmoe_cl_dispatch_map, STARPU_R, L->h_topk_idx, STARPU_W, L->h_pair_order,
	                         STARPU_W, L->h_counts, STARPU_CL_ARGS, m, sizeof(*m), STARPU_PRIORITY,
	                         rmoe_clamp_prio(starpu_sched_get_max_priority()), STARPU_NAME, "dispatch-map", 0);
	return ret ? rmoe_insert_failed("dispatch-map", ret) : 0;
}

/* The host needs the per-expert counts to size the hops' buffers: the one
 * synchronisation point of a forward (Megatron's dispatcher has the same). */
static int read_counts(struct rmoe_layer *L)
{
#ifdef STARPU_SIMGRID
	/* The router did not run: synthetic counts (sim_routing.c), written
	 * into the handle so the counts exchange carries them. */
	int rc = acquire_bounded(L->h_counts, STARPU_RW, "the expert counts");
	if (rc)
		return rc;
	rmoe_sim_expert_counts(L->T, L->K, L->E, L->ctx->rank, L->expert_counts);
#else
	int rc = acquire_bounded(L->h_counts, STARPU_R, "the expert counts");
	if (rc)
		return rc;
#endif
	L->expert_offsets[0] = 0;
	for (int64_t e = 0; e < L->E; e++)
		L->expert_offsets[e + 1] = L->expert_offsets[e] + L->expert_counts[e];
	starpu_data_release(L->h_counts);
	if (L->expert_offsets[L->E] != L->T * L->K)
		return rmoe_error(RMOE_ESTARPU, "dispatch map counted %lld pairs, expected %lld",
		                  (long long)L->expert_offsets[L->E], (long long)(L->T * L->K));
	return 0;
}

static int submit_shared_fwd(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	int64_t rows = L->T;
	starpu_data_handle_t work = rmoe_temp_vector(pass, rows * 3 * L->Fs, sizeof(float));
	starpu_data_handle_t out = rmoe_temp_vector(pass, rows * L->H, sizeof(float));
	int rc = rmoe_submit_expert_ffn(L, NULL, L->h_x, L->h_ws, 1, L->Fs, &rows, rows, work, out, 0,
	                                "shared-ffn");
	if (!rc)
		/* The pass waits for the shared expert before the dispatch starts
		 * (rmoe_layer_forward): the two never hold buffers at once. */
		rc = rmoe_submit_accumulate(pass, out, y, rows * L->H, 0, "shared-add");
	starpu_data_unregister_submit(work);
	starpu_data_unregister_submit(out);
	return rc;
}

static int submit_shared_bwd(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                             starpu_data_handle_t dx)
{
	int64_t rows = L->T;
	starpu_data_handle_t work = rmoe_temp_vector(pass, rows * 3 * L->Fs, sizeof(float));
	starpu_data_handle_t dxs = rmoe_temp_vector(pass, rows * L->H, sizeof(float));
	int rc = rmoe_submit_expert_ffn(L, NULL, L->h_x, L->h_ws, 1, L->Fs, &rows, rows, work, NULL, 0,
	                                "shared-recompute");
	if (!rc)
		rc = rmoe_submit_expert_bwd_preweighted(L, L->h_x, dy, L->h_ws, 1, L->Fs, &rows, rows, work,
		                                        dxs, L->h_dws, 0, "shared-bwd");
	if (!rc)
		rc = rmoe_submit_accumulate(pass, dxs, dx, rows * L->H, 0, "shared-dx");
	starpu_data_unregister_submit(work);
	starpu_data_unregister_submit(dxs);
	return rc;
}

/* Waits for a pass: its outputs, then every task (temporaries freed); the
 * owned weights are acquired so their outgoing transfers are complete too. */
static int finish_pass(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *outs,
                       int nouts)
{
	int rc;
	for (int i = 0; i < nouts; i++)
		if (outs[i]) {
			if ((rc = acquire_bounded(outs[i], STARPU_R, "the pass's outputs")) == RMOE_EPEER)
				return rc;
			if (!rc)
				starpu_data_release(outs[i]);
		}
	if ((rc = wait_tasks_bounded("the pass's tasks and transfers")))
		return rc;
	/* A held relay buffer may still be in a send to the next rank, which
	 * no task count shows; unregistering would wait for it without bound.
	 * A write access waits for every earlier one, needs no initialised
	 * contents (a receive buffer the pass never filled) and, on no node,
	 * moves no data. */
	for (int i = 0; i < pass->nheld; i++) {
		rc = acquire_bounded_on(pass->held[i], STARPU_ACQUIRE_NO_NODE, STARPU_W, "a relay buffer's last send");
		if (rc == RMOE_EPEER)
			return rc;
		if (!rc)
			starpu_data_release_on_node(pass->held[i], STARPU_ACQUIRE_NO_NODE);
	}
	rmoe_pass_release(pass);
	if ((rc = acquire_bounded(L->h_w_part, STARPU_RW, "the weights' last transfer")) == RMOE_EPEER)
		return rc;
	if (!rc)
		starpu_data_release(L->h_w_part);
	return 0;
}

static void record(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t dyn_base, double t0)
{
	double secs = (starpu_timing_now() - t0) * 1e-6;
	int64_t dyn = rmoe_probe_peak() - dyn_base;
	if (dyn < 0)
		dyn = 0;
	int64_t resident = L->resident_bytes + pass->resident;
	if (pass->backward) {
		L->stats.backward_seconds = secs;
		L->stats.peak_backward_bytes = resident + dyn;
		L->stats.bytes_sent_backward = pass->bytes_sent;
	} else {
		L->stats.forward_seconds = secs;
		L->stats.peak_forward_bytes = resident + dyn;
		L->stats.bytes_sent_forward = pass->bytes_sent;
	}
	L->stats.resident_bytes = resident;
	if (pass->largest_temporary > L->stats.largest_temporary_bytes)
		L->stats.largest_temporary_bytes = pass->largest_temporary;
	/* forward and backward together: the larger of the two passes */
	int64_t rss = peak_rss_bytes();
	if (!pass->backward || rss > L->stats.peak_rss_bytes)
		L->stats.peak_rss_bytes = rss;
	L->stats.hops = L->dispatch == RMOE_DISPATCH_ALLTOALL ? 0 : L->N;
	L->stats.chunk_rows = L->cfg.chunk_rows;
}

int rmoe_layer_forward(rmoe_layer *L, const float *x, float *y)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_forward: layer must not be NULL");
	wait_timeout_from(&L->cfg);
	/* Checked collectively: a rank that returned alone would leave the
	 * others waiting for it inside the pass. */
	int rc = 0;
	if (!x || !y)
		rc = rmoe_error(RMOE_EINVAL, "rmoe_layer_forward: x and y must not be NULL");
	else if (L->Fs > 0 && !L->have_shared_weights)
		rc = rmoe_error(RMOE_ESTATE, "shared_ffn = %lld but no shared expert weights were set "
		                "(rmoe_layer_set_shared)", (long long)L->Fs);
	else if (L->cfg.check_finite)
		rc = find_nonfinite(L, x, NULL, NULL, 1);
	if ((rc = agree_first(L->ctx, rc, "the forward's checks")))
		return rc;
	double t0 = starpu_timing_now();
	struct rmoe_pass pass = {0};
	rc = rmoe_tags_reserve(L->ctx, 8 * (int64_t)L->N + 8, &pass.tag_base);
	if (rc)
		return rc;

	/* §3.3: the forward keeps x (a copy: the caller may reuse its buffer)
	 * and the routing; nothing else survives to the backward. */
	rc = copy_handle(L->h_x, L->x_saved, x, (size_t)(L->T * L->H) * sizeof(float), 1);
	if (rc)
		return rc;
	memset(y, 0, (size_t)(L->T * L->H) * sizeof(float));
	starpu_data_handle_t hy = rmoe_host_vector(&pass, y, L->T * L->H, sizeof(float));

	rmoe_probe_reset();
	rss_reset();
	int64_t dyn_base = rmoe_probe_current();
	rc = submit_router_fwd(L);
	if (!rc && L->Fs > 0)
		rc = submit_shared_fwd(L, &pass, hy);
	/* The shared expert runs alone, before the dispatch posts its first
	 * receives: its buffers and the relay's never coexist, so the peak is
	 * the larger of the two phases, whatever the timing (memory_model.c). */
	if (!rc && L->Fs > 0)
		rc = wait_tasks_bounded("the shared expert");
	if (!rc)
		rc = read_counts(L);
	if (!rc) {
		if (L->dispatch == RMOE_DISPATCH_ALLTOALL)
			rc = rmoe_alltoall_forward(L, &pass, hy);
		else if (L->dispatch == RMOE_DISPATCH_RING_TOKEN)
			rc = rmoe_ring_token_forward(L, &pass, hy);
		else
			rc = rmoe_ring_expert_forward(L, &pass, hy);
	}
	/* After RMOE_EPEER tasks may still hold y: nothing more is waited for. */
	if (rc != RMOE_EPEER) {
		int frc = finish_pass(L, &pass, &hy, 1);
		if (frc == RMOE_EPEER)
			return frc;
		starpu_data_unregister(hy);
	}
	if (rc)
		return rc;
	L->have_forward = 1;
	record(L, &pass, dyn_base, t0);
	return 0;
}

static int submit_router_bwd(struct rmoe_layer *L, starpu_data_handle_t dx, starpu_data_handle_t dprobs)
{
	struct rmoe_router_args *a = malloc(sizeof(*a));
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	*a = (struct rmoe_router_args){L->T, L->H, L->E, L->K, L->cfg.norm_topk};
	struct starpu_data_descr d[9] = {
		{L->h_x, STARPU_R},      {L->h_w_router, STARPU_R}, {L->h_probs, STARPU_R},
		{L->h_topk_idx, STARPU_R}, {L->h_topk_w, STARPU_R}, {L->h_dg, STARPU_R},
		{dx, STARPU_RW},         {L->h_dw_router, STARPU_W}, {dprobs, STARPU_R},
	};
	int ret = starpu_task_insert(&rmoe_cl_router_bwd, STARPU_DATA_MODE_ARRAY, d, dprobs ? 9 : 8,
	                             STARPU_CL_ARGS, a,
	                             sizeof(*a), STARPU_FLOPS, 2 * rmoe_flops_router(L->T, L->H, L->E),
	                             STARPU_NAME, "router-bwd", 0);
	return ret ? rmoe_insert_failed("router-bwd", ret) : 0;
}

int rmoe_layer_backward(rmoe_layer *L, const float *dy, float *dx)
{
	return rmoe_layer_backward_ex(L, dy, NULL, dx);
}

int rmoe_layer_backward_ex(rmoe_layer *L, const float *dy, const float *dprobs, float *dx)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_backward: layer must not be NULL");
	wait_timeout_from(&L->cfg);
	/* Collective, as the forward's. */
	int rc = 0;
	if (!dy || !dx)
		rc = rmoe_error(RMOE_EINVAL, "rmoe_layer_backward: dy and dx must not be NULL");
	else if (!L->have_forward)
		rc = rmoe_error(RMOE_ESTATE, "rmoe_layer_backward called before any rmoe_layer_forward");
	else if (L->cfg.check_finite)
		rc = find_nonfinite(L, NULL, dy, dprobs, 0);
	if ((rc = agree_first(L->ctx, rc, "the backward's checks")))
		return rc;
	double t0 = starpu_timing_now();
	struct rmoe_pass pass = {.backward = 1};
	rc = rmoe_tags_reserve(L->ctx, 8 * (int64_t)L->N + 8, &pass.tag_base);
	if (rc)
		return rc;
	memset(dx, 0, (size_t)(L->T * L->H) * sizeof(float));
	starpu_data_handle_t hdx = rmoe_host_vector(&pass, dx, L->T * L->H, sizeof(float));
	starpu_data_handle_t hdy = rmoe_host_vector(&pass, (void *)dy, L->T * L->H, sizeof(float));
	starpu_data_handle_t hdp =
		dprobs ? rmoe_host_vector(&pass, (void *)dprobs, L->T * L->E, sizeof(float)) : NULL;

	rmoe_probe_reset();
	rss_reset();
	int64_t dyn_base = rmoe_probe_current();
	if (L->Fs > 0)
		rc = submit_shared_bwd(L, &pass, hdy, hdx);
	/* As forward: the shared expert's phase, then the dispatch's. */
	if (!rc && L->Fs > 0)
		rc = wait_tasks_bounded("the shared expert");
	if (!rc) {
		if (L->dispatch == RMOE_DISPATCH_ALLTOALL)
			rc = rmoe_alltoall_backward(L, &pass, hdy, hdx);
		else if (L->dispatch == RMOE_DISPATCH_RING_TOKEN)
			rc = rmoe_ring_token_backward(L, &pass, hdy, hdx);
		else
			rc = rmoe_ring_expert_backward(L, &pass, hdy, hdx);
	}
	if (!rc)
		rc = submit_router_bwd(L, hdx, hdp);
	starpu_data_handle_t outs[] = {hdx, L->h_dw_part, L->h_dw_router, L->h_dws};
	/* After RMOE_EPEER tasks may still hold dy and dx: nothing more is waited for. */
	if (rc != RMOE_EPEER) {
		int frc = finish_pass(L, &pass, outs, 4);
		if (frc == RMOE_EPEER)
			return frc;
		starpu_data_unregister(hdx);
		starpu_data_unregister(hdy);
		if (hdp)
			starpu_data_unregister(hdp);
	}
	if (rc)
		return rc;
	record(L, &pass, dyn_base, t0);
	return 0;
}
