/* codelets/: the operations of one MoE layer as StarPU codelets, and the one
 * way the library inserts them: an insert function per operation (as
 * Chameleon's INSERT_TASK_*). graph/ builds its task graphs from these; it
 * never names a codelet, a kernel or an argument struct. Every buffer is a
 * StarPU vector handle of float32 (int32 for indices); matrices are
 * row-major; shapes and layouts are those of codelets/kernels/rmoe_kernels.h.
 * Knows StarPU and (through the kernels) BLAS; never MPI. */
#ifndef RMOE_CODELETS_H
#define RMOE_CODELETS_H

#include <stdint.h>
#include <starpu.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where the tasks of a pass report a failure, as Chameleon's sequence and
 * request in its codelets' arguments: the first task that fails (a buffer
 * or argument that does not match its codelet, a CUDA launch, a cuBLAS
 * status) records its code, its name (with the hop) and why; a task that
 * starts after that does no work. The pass reads it once its tasks have
 * ended (rmoe_task_status_check) and every rank returns the error. Plain
 * ints with atomic accesses (status.c), so that C++ can include this. */
struct rmoe_task_status {
	int code;            /* 0, or the RMOE_E* code of the first failure */
	int claimed;         /* 1 once a failing task writes task and message */
	char task[64];
	char message[448];
};

/* Clears s before a pass submits its tasks. */
void rmoe_task_status_reset(struct rmoe_task_status *s);
/* After the tasks that report to s have ended: 0, or the first failure's
 * code, reported (rmoe_error) with the task's name and message. */
int rmoe_task_status_check(const struct rmoe_task_status *s);
/* Records a failure of task (its name) in s, the first only; returns -1.
 * Tasks call it through their prologue; the CUDA launchers' error codes
 * reach it through rmoe_cl_cuda_done. */
int rmoe_task_status_record(struct rmoe_task_status *s, int code, const char *task, const char *message);
/* Where a task inserted without a status (opts.status NULL) reports. */
struct rmoe_task_status *rmoe_task_status_default(void);

/* The task log (runtime/task_log.c): every task's submit, start and end
 * times and worker, a CSV line each as it ends, into PREFIX.RANK.csv. Open
 * turns StarPU's task profiling on. 0 or an RMOE_E* code; close reports a
 * write that failed. */
struct rmoe_task_log;
int rmoe_task_log_open(const char *prefix, int rank, struct rmoe_task_log **out);
int rmoe_task_log_close(struct rmoe_task_log *log);

/* What every insert function takes besides the operation's own data. */
struct rmoe_task_opts {
	struct rmoe_task_status *status; /* where the task reports failure; NULL: rmoe_task_status_default() */
	struct rmoe_task_log *log;   /* where the task's times go as it ends, or NULL */
	const char *name;            /* STARPU_NAME and the trace colour; must outlive the task */
	int prio;                    /* clamped into the policy's range */
	int deterministic;           /* accumulations in submission order (no STARPU_COMMUTE) */
	struct starpu_task *after;   /* a task this one waits for, or NULL */
	/* With kept != NULL the task is not destroyed when it ends (destroy =
	 * 0) and *kept receives it: the caller destroys it, after using it as a
	 * dependency anchor. */
	struct starpu_task **kept;
};

/* ---- router ---------------------------------------------------------------- */

struct rmoe_router_shape {
	int64_t tokens, hidden, experts, topk;
	int norm_topk;
};

/* buffers: x [T*H], w_router [H*E] -> probs [T*E], topk_idx [T*K] int32,
 * topk_w [T*K]. */
int rmoe_insert_router_fwd(const struct rmoe_task_opts *o, const struct rmoe_router_shape *s,
                           starpu_data_handle_t x, starpu_data_handle_t w_router, starpu_data_handle_t probs,
                           starpu_data_handle_t topk_idx, starpu_data_handle_t topk_w);

/* dx [T*H] is added to; dw_router [H*E] overwritten; dprobs [T*E] may be
 * NULL. */
int rmoe_insert_router_bwd(const struct rmoe_task_opts *o, const struct rmoe_router_shape *s,
                           starpu_data_handle_t x, starpu_data_handle_t w_router, starpu_data_handle_t probs,
                           starpu_data_handle_t topk_idx, starpu_data_handle_t topk_w, starpu_data_handle_t dg,
                           starpu_data_handle_t dprobs, starpu_data_handle_t dx, starpu_data_handle_t dw_router);

/* topk_idx [T*K] -> pair_order [T*K] int32, expert_counts [E] int32. */
int rmoe_insert_dispatch_map(const struct rmoe_task_opts *o, int64_t tokens, int64_t topk, int64_t experts,
                             starpu_data_handle_t topk_idx, starpu_data_handle_t pair_order,
                             starpu_data_handle_t expert_counts);

/* DeepEP-style dispatch (codelet_dedup.c; CPU). peer_counts [E + N] =
 * expert_counts [E], then for each of N ranks the tokens with a pair
 * routed to one of its E/N experts. */
int rmoe_insert_peer_counts(const struct rmoe_task_opts *o, int64_t tokens, int64_t topk, int64_t experts,
                            int64_t ranks, starpu_data_handle_t topk_idx, starpu_data_handle_t expert_counts,
                            starpu_data_handle_t peer_counts);
/* One rank's block, pairs [first, first + count) of pair_order [T*K]:
 * token_list [T] its distinct tokens ascending (the first distinct
 * entries, zeros after), codes [distinct*K] each pair's slot among them
 * times topk plus its top-k position (the first count entries, zeros
 * after): a pair order over distinct tokens of topk slots each. */
int rmoe_insert_dedup_map(const struct rmoe_task_opts *o, int64_t tokens, int64_t topk, int64_t first, int64_t count,
                          int64_t distinct, starpu_data_handle_t pair_order, starpu_data_handle_t token_list,
                          starpu_data_handle_t codes);

/* ---- rows of a slice of the pair order --------------------------------------- */

/* Pairs [first, first + count) of a pair order over tokens of hidden
 * floats, topk pairs per token. */
struct rmoe_pair_slice {
	int64_t first, count, hidden, topk;
};

/* rows [count*H] = the slice's token rows of src [T*H] (times the routing
 * weight when topk_w is not NULL). */
int rmoe_insert_gather(const struct rmoe_task_opts *o, const struct rmoe_pair_slice *s, starpu_data_handle_t src,
                       starpu_data_handle_t pair_order, starpu_data_handle_t topk_w, starpu_data_handle_t rows);

/* dst [T*H] += rows (times the routing weight when topk_w is not NULL) at
 * each pair's token: §3.1's in-place accumulation, commutative across hops
 * unless o->deterministic. */
int rmoe_insert_scatter_add(const struct rmoe_task_opts *o, const struct rmoe_pair_slice *s,
                            starpu_data_handle_t rows, starpu_data_handle_t pair_order, starpu_data_handle_t topk_w,
                            starpu_data_handle_t dst);

/* All-to-all combine backward: dout [count*H] = g dy of each pair's token,
 * and the slice's pairs of dg [T*K] = <dy, back>. */
int rmoe_insert_unpermute_bwd(const struct rmoe_task_opts *o, const struct rmoe_pair_slice *s,
                              starpu_data_handle_t dy, starpu_data_handle_t back, starpu_data_handle_t pair_order,
                              starpu_data_handle_t topk_w, starpu_data_handle_t dout, starpu_data_handle_t dg);

/* ---- experts: one task per partition (grouped GEMM) --------------------------- */

/* rows rows grouped by expert: rows_per_expert[e] for local expert e. */
struct rmoe_expert_shape {
	int64_t hidden, ffn, n_experts, rows;
	const int64_t *rows_per_expert;
};

/* SwiGLU FFN: rows [m*H], the partition's weights -> work [m*3F] and out
 * [m*H]; with out NULL, the §3.3 recompute that stops at the SwiGLU output
 * (work may then be the [m*4F] workspace of the pair-weighted backward). */
int rmoe_insert_expert_ffn(const struct rmoe_task_opts *o, const struct rmoe_expert_shape *s,
                           starpu_data_handle_t rows, starpu_data_handle_t weights, starpu_data_handle_t work,
                           starpu_data_handle_t out);

/* Pair-weighted backward (ring, §3.3) of the pairs [first, first + rows) of
 * pair_order: x rows consumed into the rows' dx, added into dx [T*H]; dg
 * [T*K] written for the slice's pairs; dweights overwritten, or added to
 * when accumulate. work [m*4F] as the recompute left it. dx NULL
 * (RMOE_BWD_PAIR_ROWS, the lean all-to-all): no addition, the rows' dx are
 * the result, left in xrows. */
int rmoe_insert_expert_bwd_pairs(const struct rmoe_task_opts *o, const struct rmoe_expert_shape *s,
                                 int64_t first, int64_t topk, int accumulate, starpu_data_handle_t xrows,
                                 starpu_data_handle_t dyrows, starpu_data_handle_t weights,
                                 starpu_data_handle_t pair_order, starpu_data_handle_t topk_w,
                                 starpu_data_handle_t work, starpu_data_handle_t dx, starpu_data_handle_t dg,
                                 starpu_data_handle_t dweights);

/* Preweighted backward (Megatron's all-to-all, shared expert): dout rows carry the
 * routing weight; work [m*3F] holds the forward's intermediates; dx rows
 * [m*H] written; dweights overwritten, or added to when accumulate. */
int rmoe_insert_expert_bwd_preweighted(const struct rmoe_task_opts *o, const struct rmoe_expert_shape *s,
                                       int accumulate, starpu_data_handle_t xrows, starpu_data_handle_t doutrows,
                                       starpu_data_handle_t weights, starpu_data_handle_t work,
                                       starpu_data_handle_t dxrows, starpu_data_handle_t dweights);

/* ---- the shared expert's gate (Qwen2-MoE) ------------------------------------------ */

/* shared_out [T*H] *= sigmoid(x [T*H] w [H]) per token. */
int rmoe_insert_shared_gate_fwd(const struct rmoe_task_opts *o, int64_t tokens, int64_t hidden,
                                starpu_data_handle_t x, starpu_data_handle_t w, starpu_data_handle_t shared_out);
/* Backward: shared_out (the ungated output, recomputed) becomes the gated
 * dy that the shared expert's backward takes; dx [T*H] added to (an
 * accumulator, as the router's); dw [H] overwritten. */
int rmoe_insert_shared_gate_bwd(const struct rmoe_task_opts *o, int64_t tokens, int64_t hidden,
                                starpu_data_handle_t x, starpu_data_handle_t w, starpu_data_handle_t dy,
                                starpu_data_handle_t shared_out, starpu_data_handle_t dx, starpu_data_handle_t dw);

/* ---- small ops -------------------------------------------------------------------- */

/* dst += src (count floats): the ring's G_j += S. */
int rmoe_insert_accumulate(const struct rmoe_task_opts *o, int64_t count, starpu_data_handle_t src,
                           starpu_data_handle_t dst);
/* dst = 0 (count floats): an empty contribution. */
int rmoe_insert_zero(const struct rmoe_task_opts *o, int64_t count, starpu_data_handle_t dst);
/* dst [n_dst] = the first elements of src [n_src], zeros after them: a
 * rank's token partition padded to the rows every rank's have, and back. */
int rmoe_insert_copy_pad(const struct rmoe_task_opts *o, int64_t n_src, starpu_data_handle_t src, int64_t n_dst,
                         starpu_data_handle_t dst);

/* An ordering task that computes nothing and moves no data: it ends once
 * every earlier writer of each ready handle has ended (a read), and every
 * earlier access of each next handle (a write, never performed); every later
 * access of a next handle waits for it. So a fresh handle in next is
 * allocated by its next user only after the fence, and a handle in next
 * unregistered after the fence is freed once it ends. NULL entries are
 * skipped. */
int rmoe_insert_fence(const struct rmoe_task_opts *o, const starpu_data_handle_t *ready, int nready,
                      const starpu_data_handle_t *next, int nnext);

enum rmoe_sort_direction {
	RMOE_SORT_BY_EXPERT = 0,     /* per-peer rows -> sorted by (local expert, peer) */
	RMOE_UNSORT_TO_PEERS = 1,    /* and back */
};
/* The all-to-all's sort by local expert: counts[q*n_experts + e] rows of
 * local expert e from peer q; per_peer[q] is NULL for a peer with no rows. */
int rmoe_insert_sort_chunks(const struct rmoe_task_opts *o, enum rmoe_sort_direction direction, int64_t hidden,
                            int64_t n_peers, int64_t n_experts, const int64_t *counts,
                            const starpu_data_handle_t *per_peer, starpu_data_handle_t sorted);

/* ---- element types ----------------------------------------------------------------------- */

/* Activations and weights are float32 (4 bytes) or bf16 (2 bytes, fp32
 * accumulation in every kernel); routing stays 4-byte. A buffer's element
 * size says which. On the host, at a layer's edges: n float32 values to
 * elements of elsize bytes, and back (4: a copy). */
void rmoe_to_elements(const float *src, void *dst, int64_t n, size_t elsize);
void rmoe_from_elements(const void *src, float *dst, int64_t n, size_t elsize);

/* ---- set-up, flops, memory probe ---------------------------------------------------- */

/* One-time set-up of the kernels' environment (BLAS threads: one per worker
 * until a context says more, since StarPU owns the cores; the simulation's
 * cost models). Idempotent:
 * 0, or the first call's RMOE_E* code (a recorded model not readable). */
int rmoe_codelets_init(void);

/* OpenBLAS threads per BLAS call from now on (n >= 1), for every worker:
 * the context gives those its workers leave idle (graph/context/ctx_blas.c). n, or 0
 * where the BLAS is not OpenBLAS (nothing set). */
int rmoe_codelets_blas_threads(int n);

/* While a context uses StarPU (between its start and its end): the CUDA
 * workers' cuBLAS handles, on their streams. Counted: the last stop
 * releases them. Nothing without CUDA codelets. */
void rmoe_codelets_start(void);
void rmoe_codelets_stop(void);

/* Flop counts, for STARPU_FLOPS and the benchmarks. */
double rmoe_flops_expert_ffn(int64_t rows, int64_t hidden, int64_t ffn, int with_down);
double rmoe_flops_expert_bwd(int64_t rows, int64_t hidden, int64_t ffn);
double rmoe_flops_router(int64_t tokens, int64_t hidden, int64_t experts);

/* Every codelet samples, on entry (when all its buffers are allocated), the
 * bytes StarPU holds in main memory; the graph reads the running maximum.
 * StarPU 1.3 has no peak counter, hence sampling. */
void rmoe_probe_reset(void);
int64_t rmoe_probe_peak(void);
int64_t rmoe_probe_current(void);
/* The largest peak over this process's GPU memory nodes since the reset
 * (what StarPU held there, absolute); 0 without a GPU. */
int64_t rmoe_probe_device_peak(void);

/* The heap probe (heap.c): the bytes the process has malloc'ed (glibc's
 * mallinfo2: in use in the arenas plus mmap'ed chunks), whoever allocated
 * them, sampled with the probe above; independent of StarPU's accounting.
 * reset sets the running maximum to the bytes in use now and returns them. */
int64_t rmoe_heap_current(void);
int64_t rmoe_heap_reset(void);
int64_t rmoe_heap_peak(void);
/* The runtime's bookkeeping (bookkeeping.c): every handle, task and
 * StarPU-MPI request the library makes is counted where it is made;
 * rmoe_bookkeeping_bytes is the running total of their structures' bytes
 * (a pass takes the difference over itself). measure: once per process,
 * after StarPU starts, the bytes of a handle, a task and a task's buffer
 * (StarPU only); the graph measures and sets a request's
 * (rmoe_bookkeeping_set_requests). */
int rmoe_bookkeeping_measure(void);
void rmoe_bookkeeping_set_requests(int64_t send, int64_t recv);
void rmoe_bookkeeping_units(int64_t *handle, int64_t *task, int64_t *task_buffer, int64_t *send, int64_t *recv);
void rmoe_bookkeeping_count_handle(void);
void rmoe_bookkeeping_count_task(int nbuffers, size_t argsize);
void rmoe_bookkeeping_count_request(int send);
int64_t rmoe_bookkeeping_bytes(void);
/* The sampler thread (sampler.c): samples both probes every 0.5 ms between a start and
 * its stop, so memory held while no codelet runs (exchanges in flight) is
 * seen. Counted: the first start creates it, the last stop joins it. 0, or
 * -1 when it could not start (a simulation, or no thread): the codelets'
 * samples remain. Stop only after a start that returned 0. */
int rmoe_sampler_start(void);
void rmoe_sampler_stop(void);

/* The cache of StarPU's main-memory buffers (host_cache.c). install: before
 * the context starts StarPU, setting = RMOE_HOST_CACHE (NULL or "auto": on,
 * idle bytes bounded by the peak of live bytes; "off"; or a size such as
 * 512M capping the idle bytes); 0 or RMOE_EINVAL naming the setting.
 * uninstall: after StarPU's shutdown, frees the idle blocks. */
int rmoe_host_cache_install(const char *setting);
void rmoe_host_cache_uninstall(void);
struct rmoe_host_cache_stats {
	int installed;
	int64_t idle_bytes, live_bytes, live_want, hwm_bytes; /* live: mapped; live_want: asked for */
	int64_t hits, misses;
};
void rmoe_host_cache_stats(struct rmoe_host_cache_stats *s);
/* allocated() (the allocator's count of bytes in use) less what malloc
 * holds for the cache beyond what StarPU asked for: its idle blocks and the
 * size classes' slack, read together with them (the heap probe). */
int64_t rmoe_host_cache_heap(int64_t (*allocated)(void));
/* Sizes in classes of an eighth of an octave: bytes rounded up by at most
 * 12.5% (at least 4096). */
int64_t rmoe_size_class(int64_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* RMOE_CODELETS_H */
