/* relaymoe: Mixture-of-Experts layers of distributed training as StarPU task
 * graphs, with the ring dispatch of RelayMoE (expert weights or token
 * activations circulate around the ranks; every hop computes locally).
 *
 * The public API is plain C: opaque handles, plain configuration structs and
 * int return codes (0 or a negative RMOE_E* code). Nothing here needs
 * <starpu.h> or <mpi.h>; relaymoe_mpi.h adds the one call that takes an
 * MPI_Comm.
 *
 * Layout conventions (all row-major, float32 unless stated):
 *   x, y, dy, dx       [T, H]     T = tokens of this rank in this call
 *                                 (rmoe_layer_set_tokens; at most the
 *                                 capacity, rmoe_layer_config.tokens)
 *   w_router           [H, E]
 *   w_gate, w_up (e)   [H, F]     expert e
 *   w_down (e)         [F, H]
 * expert_e(x) = (silu(x w_gate[e]) * (x w_up[e])) w_down[e]
 * y = sum_k g_k expert_{i_k}(x) (+ shared(x) when a shared expert is set).
 * The shared expert is added ungated (DeepSeek-style), or gated as in
 * Qwen2-MoE: + sigmoid(x w_shared_expert_gate) shared(x), with
 *   w_shared_expert_gate [H]   replicated, as the router.
 */
#ifndef RELAYMOE_H
#define RELAYMOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(RMOE_BUILDING_LIBRARY) && defined(__GNUC__)
#define RMOE_API __attribute__((visibility("default")))
#else
#define RMOE_API
#endif

/* The one source of the version: CMakeLists.txt reads these three lines
 * (the library's soname, the CMake package and the .pc file follow). */
#define RMOE_VERSION_MAJOR 0
#define RMOE_VERSION_MINOR 1
#define RMOE_VERSION_PATCH 0

/* ---- errors ------------------------------------------------------------ */

enum rmoe_error {
	RMOE_OK = 0,
	RMOE_EINVAL = -1,      /* a configuration or argument value is out of range */
	RMOE_ENOMEM = -2,      /* an allocation failed (host, StarPU or device) */
	RMOE_EMPI = -3,        /* an MPI call failed, or MPI is unusable as set up */
	RMOE_ESTARPU = -4,     /* StarPU or StarPU-MPI returned an error */
	RMOE_EMISMATCH = -5,   /* ranks disagree (configuration, weights, sizes) */
	RMOE_ESTATE = -6,      /* call out of order (e.g. backward before forward) */
	RMOE_ENOTSUP = -7,     /* not supported by this build or configuration */
	RMOE_EIO = -8,         /* a file could not be read or written */
	RMOE_ENONFINITE = -9,  /* NaN or infinity in an input or weight */
	RMOE_EFORMAT = -10,    /* a file or description does not parse or match */
	RMOE_EPEER = -11,      /* another rank failed or disappeared */
};

/* The sentence for code: the detailed message of the last error raised on
 * this thread when it carries that code (it names the bad value and what was
 * expected), otherwise a generic description. Never NULL. */
RMOE_API const char *rmoe_strerror(int code);

/* ---- context: MPI + StarPU for one process ----------------------------- */

typedef struct rmoe_ctx rmoe_ctx;

/* The order of the ranks around the ring. */
enum rmoe_ring_order {
	RMOE_RING_PLANNED = 0,         /* from the topology: each node's ranks together, so
	                                  the ring crosses between nodes once per node */
	RMOE_RING_RANK = 1,            /* rank order, whatever the placement: the baseline
	                                  the planned order is measured against */
};

struct rmoe_ctx_config {
	int ncpus;            /* CPU workers per rank; 0 = automatic (cores / ranks on the node) */
	int ncuda;            /* CUDA workers per rank; -1 = all visible, 0 = none */
	const char *sched;    /* StarPU scheduling policy; NULL = STARPU_SCHED or StarPU's default */
	int verbose;          /* 0 = quiet, 1 = one line per decision */
	const char *cluster_file; /* a cluster description placing the ranks on nodes
	                             instead of the live topology (NULL: discover) */
	const char *trace;    /* a folder (created if missing) to record an FxT trace of
	                         every rank into (prof_file_<rank>); rmoe_ctx_destroy then
	                         merges and converts them there on rank 0 (paje.trace,
	                         tasks.rec, dag.dot, ..., and relaymoe-trace.txt, the ring
	                         and tag layout that scripts/trace/ reads). Rank 0 must see
	                         every rank's file (one node, or a shared file system).
	                         Needs a StarPU built with FxT and a StarPU started by the
	                         context (RMOE_ENOTSUP otherwise). NULL = no trace. */
	int ring_order;       /* enum rmoe_ring_order: the ring of every layer of the
	                         context; RMOE_RING_PLANNED by default */
	int blas_threads;     /* OpenBLAS threads per BLAS call of a CPU codelet; 0 =
	                         automatic: OPENBLAS_NUM_THREADS when set, otherwise
	                         the rank's share of the cores (the CPUs the process
	                         may run on / ranks on the node, less its CUDA
	                         workers) divided by its CPU workers, at least 1. A
	                         rank's pass is a chain of expert tasks, so the
	                         cores its workers leave would otherwise idle; the
	                         division keeps the workers' BLAS threads from
	                         oversubscribing the cores. Process-wide (OpenBLAS
	                         has one setting) */
	int ranks_per_node;   /* > 0: consecutive ranks, this many at a time, are
	                         one node for the topology, whatever their hosts
	                         (several nodes emulated on one machine); 0 = by
	                         host name (the default). A cluster description's
	                         placement wins */
};

/* Defaults: automatic workers and BLAS threads, no GPU preference, StarPU's policy,
 * quiet, no trace, the planned ring. */
RMOE_API void rmoe_ctx_config_init(struct rmoe_ctx_config *cfg);

/* Create the context over MPI_COMM_WORLD. If MPI is not initialised, MPI is
 * initialised with MPI_THREAD_MULTIPLE and finalised by rmoe_ctx_destroy; if the
 * application initialised it, it must have asked for MPI_THREAD_MULTIPLE. A
 * StarPU already running is used as it is and left running. cfg may be NULL. */
RMOE_API int rmoe_ctx_create(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg);

/* The same over a Fortran communicator handle (MPI_Comm_c2f / mpi_comm%mpi_val). */
RMOE_API int rmoe_ctx_create_fcomm(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg, int fortran_comm);

/* Shut down what rmoe_ctx_create started, and nothing else. */
RMOE_API int rmoe_ctx_destroy(rmoe_ctx *ctx);

RMOE_API int rmoe_ctx_rank(const rmoe_ctx *ctx);
RMOE_API int rmoe_ctx_size(const rmoe_ctx *ctx);

/* What a context runs on, for the record of a result: the scheduling
 * policy StarPU runs (NULL without a context), this rank's StarPU workers
 * of each kind, and StarPU's version with the features of its build, e.g.
 * "1.3.10 cuda fxt" (cuda, fxt, simgrid). */
RMOE_API const char *rmoe_ctx_sched_policy(const rmoe_ctx *ctx);
RMOE_API int rmoe_ctx_workers(const rmoe_ctx *ctx, int *cpu_workers, int *cuda_workers);
/* The OpenBLAS threads per call the context set (rmoe_ctx_config.blas_threads,
 * or its automatic value); 0 where the BLAS is not OpenBLAS, -1 without a
 * context. */
RMOE_API int rmoe_ctx_blas_threads(const rmoe_ctx *ctx);
RMOE_API const char *rmoe_starpu_build(void);
/* The kernel set OpenBLAS runs ("SkylakeX", "Haswell", ...; "unknown"
 * for another BLAS), and the OPENBLAS_CORETYPE value that would run the
 * wider vector kernels this CPU supports where OpenBLAS chose narrower
 * ones (a CPU newer than the library), else NULL. OPENBLAS_CORETYPE is
 * read when OpenBLAS loads: set it in the environment of the program
 * (the relaymoe command does so itself). */
RMOE_API const char *rmoe_blas_core(void);
RMOE_API const char *rmoe_blas_core_advice(void);

/* The ring order planned for this context: order[i] is the rank at ring
 * position i (rmoe_ctx_size entries). Every rank has the same. */
RMOE_API int rmoe_ctx_ring_order(const rmoe_ctx *ctx, int *order);

/* ---- one MoE layer ----------------------------------------------------- */

typedef struct rmoe_layer rmoe_layer;

enum rmoe_dispatch {
	RMOE_DISPATCH_ALLTOALL = 0,    /* permute / all-to-all / unpermute pipelined per peer and
	                                * chunk, backward with the ring's pair-weighted expert kernel
	                                * (lean buffers; chunk_rows and mem_cap apply) */
	RMOE_DISPATCH_RING_EXPERT = 1, /* expert weights circulate (paper §3.1) */
	RMOE_DISPATCH_RING_TOKEN = 2,  /* token activations circulate (paper §3.2) */
	RMOE_DISPATCH_AUTO = 3,        /* chosen at creation from per-hop volumes (Table 2) */
	RMOE_DISPATCH_ALLTOALL_MEGATRON = 4, /* Megatron Core 0.13's alltoall dispatcher: probabilities
	                                      * exchanged and applied in the expert, unpermute without
	                                      * them; backward recomputes dispatch and experts */
	RMOE_DISPATCH_ALLTOALL_DEEPEP = 5,   /* DeepEP's normal-mode dispatch: each token sent once to
	                                      * each rank owning one of its experts, with their ids and
	                                      * weights, expanded there; the combine reduces a token's
	                                      * outputs on the experts' rank and sends one row back
	                                      * (whole blocks: chunk_rows and mem_cap do not apply) */
};

enum rmoe_dtype {
	RMOE_DTYPE_F32 = 0,
	RMOE_DTYPE_BF16 = 1,           /* bf16 storage of weights, activations and transfers,
	                                  fp32 accumulation; the router and routing stay fp32 */
};

struct rmoe_layer_config {
	int64_t hidden;      /* H */
	int64_t ffn;         /* F, width of one routed expert */
	int64_t experts;     /* E, divisible by the number of ranks */
	int64_t topk;        /* K, 1 <= K <= E */
	int64_t tokens;      /* the capacity: the most tokens of one rank in one
	                        call, what the layer allocates and the memory
	                        model and mem_cap plan for (same on every rank).
	                        Each rank's count may differ, from call to call
	                        too: rmoe_layer_set_tokens */
	int norm_topk;       /* divide the top-k probabilities by their sum (Qwen3: 1) */
	int64_t shared_ffn;  /* width of the shared expert; 0 = none */
	int shared_gated;    /* 1: the shared expert's output is scaled per token by
	                        sigmoid(x w_shared_expert_gate) (Qwen2-MoE's
	                        shared_expert_gate); 0 (default): added as it is
	                        (DeepSeek-style). Needs shared_ffn > 0 */
	enum rmoe_dispatch dispatch;
	enum rmoe_dtype dtype;
	int64_t chunk_rows;  /* split each hop's matched pairs into chunks of at most
	                        this many rows; 0 = one chunk per hop */
	int overlap;         /* 1: transfers overlap compute (default); 0: serialised */
	int deterministic;   /* 1: accumulations into y and dx run in submission
	                        order, so runs are bit-reproducible; 0 (default):
	                        in any order (StarPU's commutative access) */
	int64_t mem_cap;     /* bytes the layer's peak may reach (ring dispatch):
	                        each hop's rows are processed in chunks sized from
	                        the memory model; 0 = no cap */
	int check_finite;    /* 1: forward checks x and the weights, backward dy
	                        (and dprobs), for NaN and infinity before any work
	                        starts, as rmoe_layer_check_finite does; 0 (default):
	                        no check */
	double wait_timeout; /* seconds one wait of a collective call (for another
	                        rank's data, or for the ranks to agree) may last
	                        before the call gives up with RMOE_EPEER: a rank
	                        died or stopped calling. 0: wait forever (the
	                        default, unless the environment variable
	                        RMOE_WAIT_TIMEOUT gives seconds). After RMOE_EPEER
	                        the layer and its context can be neither used nor
	                        destroyed: end the process (MPI_Abort). Choose it
	                        well above the longest pass. */
	int64_t partitions;  /* ring dispatch: each rank's experts as this many
	                        partitions computed one after the other, as the
	                        hops of a ring on one device (no transfer between
	                        them): a hop's temporaries are about
	                        T*K/(ranks*partitions) rows. Divides experts/ranks;
	                        0 or 1: one partition per rank */
	int window;          /* ring dispatch: receive buffers per relayed kind
	                        (weights, gradients, tokens, accumulators), W >= 2;
	                        a rank receives at most W hops ahead of what it has
	                        consumed: its left neighbour sends hop h only once
	                        it has released the buffer of hop h-W (a credit).
	                        0 = default 2 (double buffering) */
	int stripes;         /* the rings (expert and token routing): each hop
	                        whose edge joins two nodes goes in this many
	                        stripes, one per network adapter, relayed over
	                        the GPU links by the ranks that own the adapters
	                        (scheduler/stripes.c); 0 = as planned (the
	                        node's adapters: the cluster's nics_per_node,
	                        else one per rank), 1 = the flat ring. At most
	                        16. The all-to-alls: 0 or 1 */
};

/* Defaults: the Qwen3-30B-A3B layer with H, F and tokens divided by 16
 * (H=128, F=48, E=128, K=8, T=3072), norm_topk on, no shared expert, ring
 * expert routing, fp32, no chunking, overlap on, no finite check, waits
 * without a timeout unless RMOE_WAIT_TIMEOUT says otherwise (a malformed
 * value makes rmoe_layer_create refuse the configuration, naming it). */
RMOE_API void rmoe_layer_config_init(struct rmoe_layer_config *cfg);

/* Collective over the context's ranks. Checks the configuration (every value,
 * and that every rank passed the same one) before any work starts, and that
 * the layer fits this rank's memory (the buffers it keeps plus the memory
 * model's peak, against the address-space limit and the node's memory, or
 * the job's cgroup limit, shared by its ranks): RMOE_ENOMEM otherwise, as
 * for a failed allocation.
 * Every rank returns the same code. */
RMOE_API int rmoe_layer_create(rmoe_layer **layer, rmoe_ctx *ctx, const struct rmoe_layer_config *cfg);
RMOE_API int rmoe_layer_destroy(rmoe_layer *layer);

/* This rank's token count T for the forwards that follow, 0 included (a
 * rank with no tokens still serves its experts to the others). Not
 * collective: ranks may pass different counts, and change them from call
 * to call. Until it is called, T is the configuration's tokens. The
 * forward shares every rank's count (it was collective already); a
 * backward takes the count of the last forward. A count above the
 * capacity grows it on every rank at that forward (the kept [T, *]
 * buffers are reallocated), except under mem_cap, which was planned for
 * the capacity: that forward fails on every rank with RMOE_EINVAL naming
 * the rank and the count. RMOE_EINVAL here for a negative count. */
RMOE_API int rmoe_layer_set_tokens(rmoe_layer *layer, int64_t tokens);
/* The count the next forward takes (as last set), or -1 for NULL. */
RMOE_API int64_t rmoe_layer_tokens(const rmoe_layer *layer);

/* Routed experts this rank owns: [first, first + count). */
RMOE_API int rmoe_layer_owned_experts(const rmoe_layer *layer, int64_t *first, int64_t *count);

/* The dispatch the layer runs (the choice made for RMOE_DISPATCH_AUTO), and
 * why: for auto, the per-hop volumes and times that decided (paper §3.2). */
RMOE_API enum rmoe_dispatch rmoe_layer_dispatch(const rmoe_layer *layer);
RMOE_API const char *rmoe_layer_dispatch_reason(const rmoe_layer *layer);

/* The most stripes any hop of the layer's ring goes in (cfg.stripes as
 * planned): 1 when no hop is striped; 0 for a NULL layer. */
RMOE_API int rmoe_layer_stripes(const rmoe_layer *layer);

/* Weights. Router and shared expert are replicated: every rank sets the same
 * values. Routed experts are set and read on their owner only (e global). */
RMOE_API int rmoe_layer_set_router(rmoe_layer *layer, const float *w_router);
RMOE_API int rmoe_layer_get_router(const rmoe_layer *layer, float *w_router);
RMOE_API int rmoe_layer_set_expert(rmoe_layer *layer, int64_t e, const float *w_gate, const float *w_up,
                          const float *w_down);
RMOE_API int rmoe_layer_get_expert(const rmoe_layer *layer, int64_t e, float *w_gate, float *w_up,
                          float *w_down);
RMOE_API int rmoe_layer_set_shared(rmoe_layer *layer, const float *w_gate, const float *w_up,
                          const float *w_down);
/* The gate of a gated shared expert (shared_gated = 1): w [H], replicated. */
RMOE_API int rmoe_layer_set_shared_expert_gate(rmoe_layer *layer, const float *w);
RMOE_API int rmoe_layer_get_shared_expert_gate(const rmoe_layer *layer, float *w);

/* Forward: x [T, H] -> y [T, H]. Collective. The layer keeps a copy of x and
 * the routing (indices and weights) for backward; nothing else. Arguments
 * (and, with check_finite, x and the weights) are checked on every rank
 * before any work: one rank's bad argument fails every rank, alike. A task
 * that fails during the pass (a buffer that does not match its codelet, a
 * CUDA launch or cuBLAS error) fails the call on every rank with
 * RMOE_ESTARPU, naming the task, its hop and the rank it failed on; the
 * contents of y (dx, and the gradients, for the backward) are then
 * unspecified, and the next call runs afresh. */
RMOE_API int rmoe_layer_forward(rmoe_layer *layer, const float *x, float *y);

/* Backward of the last forward: dy [T, H] -> dx [T, H]; weight gradients are
 * kept in the layer (overwritten, not accumulated) and read below. */
RMOE_API int rmoe_layer_backward(rmoe_layer *layer, const float *dy, float *dx);

/* As rmoe_layer_backward, with a gradient on the router probabilities
 * (dprobs [T, E], may be NULL) added to the one from the routing weights, as
 * a load-balancing loss on the probabilities has. */
RMOE_API int rmoe_layer_backward_ex(rmoe_layer *layer, const float *dy, const float *dprobs, float *dx);

/* ---- activations in the layer's element type, on the host or the device -- */

/* Where the buffers of the _raw calls live. */
enum rmoe_memory {
	RMOE_MEMORY_HOST = 0,   /* main memory */
	RMOE_MEMORY_DEVICE = 1, /* this rank's CUDA device (that of its first CUDA
	                           worker): what cudaMalloc, or rmoe_ctx_alloc,
	                           returned there */
};

/* rmoe_layer_forward and rmoe_layer_backward_ex on buffers in the layer's
 * element type (float for f32, bf16 bits as uint16_t for bf16), converted
 * nowhere; on the device nothing goes through the host, as a GPU training
 * step keeps its activations on the device. x, y, dy, dx [T, H]; dprobs
 * [T, E] float (may be NULL) in the same memory. The weights' gradients stay
 * where they were computed until rmoe_layer_get_grad_* reads them.
 * RMOE_ENOTSUP for RMOE_MEMORY_DEVICE on a rank without a CUDA worker, or
 * with check_finite (which reads on the host). Collective, as the others. */
RMOE_API int rmoe_layer_forward_raw(rmoe_layer *layer, enum rmoe_memory where, const void *x, void *y);
RMOE_API int rmoe_layer_backward_raw(rmoe_layer *layer, enum rmoe_memory where, const void *dy,
                                     const float *dprobs, void *dx);

/* Buffers for the _raw calls, through StarPU (on the device: counted in
 * its memory, as the layer's own buffers are). Not collective. */
RMOE_API int rmoe_ctx_alloc(rmoe_ctx *ctx, enum rmoe_memory where, size_t bytes, void **ptr);
RMOE_API int rmoe_ctx_free(rmoe_ctx *ctx, enum rmoe_memory where, void *ptr, size_t bytes);
/* Copies bytes between any two of them (host to device, device to host,
 * ...); returns when the copy is done. */
RMOE_API int rmoe_ctx_copy(rmoe_ctx *ctx, void *dst, enum rmoe_memory dst_where, const void *src,
                           enum rmoe_memory src_where, size_t bytes);

/* n float32 values to a layer's element type (bf16: rounded to nearest
 * even), and back; dst and src do not overlap. */
RMOE_API void rmoe_to_dtype(const float *src, void *dst, int64_t n, enum rmoe_dtype dtype);
RMOE_API void rmoe_from_dtype(const void *src, float *dst, int64_t n, enum rmoe_dtype dtype);

/* Gradients of the last backward. dw_router is this rank's part (from its own
 * tokens): sum it over ranks as for any replicated parameter. Expert
 * gradients are complete (all ranks' tokens) and read on the owner. */
RMOE_API int rmoe_layer_get_grad_router(const rmoe_layer *layer, float *dw_router);
RMOE_API int rmoe_layer_get_grad_expert(const rmoe_layer *layer, int64_t e, float *dw_gate, float *dw_up,
                               float *dw_down);
RMOE_API int rmoe_layer_get_grad_shared(const rmoe_layer *layer, float *dw_gate, float *dw_up,
                               float *dw_down);
/* dw [H] of the shared expert's gate: this rank's part, as dw_router (sum it
 * over ranks). */
RMOE_API int rmoe_layer_get_grad_shared_expert_gate(const rmoe_layer *layer, float *dw);

/* Collective. Looks for NaN and infinity in the layer's weights (router,
 * the experts this rank owns, the shared expert) and, when not NULL, in x
 * and dy ([T, H] each). 0 on every rank, or RMOE_ENONFINITE on every rank
 * with the same message: the lowest failing rank, the tensor, the index and
 * the value of its first non-finite element. */
RMOE_API int rmoe_layer_check_finite(rmoe_layer *layer, const float *x, const float *dy);

/* Routing of the last forward: indices [T, K] (int32) and weights [T, K];
 * probs [T, E] (softmax). Any pointer may be NULL. */
RMOE_API int rmoe_layer_get_routing(const rmoe_layer *layer, int32_t *topk_idx, float *topk_w, float *probs);

/* What the last forward and backward cost on this rank. */
struct rmoe_layer_stats {
	double forward_seconds;
	double backward_seconds;
	int64_t peak_forward_bytes;   /* the layer's StarPU data, sampled at every task */
	int64_t peak_backward_bytes;
	int64_t resident_bytes;       /* part of the peaks that lives across calls */
	int64_t largest_temporary_bytes; /* largest buffer registered by a graph */
	int64_t bytes_sent_forward;   /* bytes this rank handed to StarPU-MPI */
	int64_t bytes_sent_backward;
	int64_t peak_rss_bytes;       /* process peak RSS during the last forward and
	                                 backward (VmHWM, reset at each pass) */
	int hops;                     /* ring hops (0 for all-to-all) */
	int64_t chunk_rows;           /* rows per chunk of a hop (0: whole hops) */
	int64_t peak_device_forward_bytes;  /* what StarPU held on this rank's device
	                                       (a GPU's memory node), sampled at
	                                       every task; 0 without a device */
	int64_t peak_device_backward_bytes;
	int host_waits_forward;       /* times the dispatch graph stopped the host to
	                                 wait for data, tasks or other ranks while it
	                                 was submitted (after the router, before the
	                                 pass's end): the all-to-all waits for each
	                                 peer's expert counts, which size its
	                                 buffers, and for nothing else; token
	                                 routing for the same counts; expert
	                                 routing (with overlap) never */
	int host_waits_backward;
	int64_t peak_heap_forward_bytes;  /* the same resident part as the peaks
	                                     above plus the process heap's growth
	                                     during the pass (glibc mallinfo2:
	                                     every malloc and mmap'ed chunk, whoever
	                                     made it: StarPU's buffers, codelet
	                                     scratch, MPI's unexpected messages),
	                                     sampled at every task and every 0.5 ms,
	                                     so exchanges in flight count. Not in it:
	                                     memory mapped before the pass without
	                                     malloc (OpenBLAS's per-thread GEMM
	                                     workspace, Open MPI's shared-memory
	                                     segments, thread stacks). Counts the
	                                     whole process: another layer's pass
	                                     running at once would count here */
	int64_t peak_heap_backward_bytes;
	int64_t runtime_forward_bytes;    /* the runtime's structures the pass's
	                                     graph held: its StarPU handles, tasks
	                                     (with their arguments) and StarPU-MPI
	                                     requests, counted as submitted, each
	                                     at its size measured in this StarPU
	                                     when the context started. A pass
	                                     submits its whole graph at once, so
	                                     the heap figure holds them beside the
	                                     data; an upper bound of what its peak
	                                     holds (a task ended is freed). 0 in a
	                                     simulation */
	int64_t runtime_backward_bytes;
};
RMOE_API int rmoe_layer_get_stats(const rmoe_layer *layer, struct rmoe_layer_stats *stats);

/* Rounds n float32 values in place to what a layer of element type dtype
 * stores (bf16: to nearest even), e.g. to build the exact inputs of a
 * reference computation. */
RMOE_API void rmoe_round_to_dtype(float *values, int64_t n, enum rmoe_dtype dtype);

/* Names used on command lines and in output. */
RMOE_API const char *rmoe_dispatch_name(enum rmoe_dispatch d);
RMOE_API int rmoe_dispatch_parse(const char *name, enum rmoe_dispatch *d);

#ifdef __cplusplus
}
#endif

#endif /* RELAYMOE_H */
