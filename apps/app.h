/* Shared pieces of the relaymoe command-line programs. */
#ifndef RMOE_APP_H
#define RMOE_APP_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "relaymoe/relaymoe.h"

/* Subcommands: each owns its options and returns the process exit code. */
int rmoe_cmd_run(int argc, char **argv, int first);
int rmoe_cmd_train(int argc, char **argv, int first);
int rmoe_cmd_plan(int argc, char **argv, int first);

/* Every rank learns the worst (lowest) code of all ranks. */
int rmoe_app_agree(int rc);

/* Rank 0 prints; the others stay quiet. */
void rmoe_app_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Every rank prints an error line prefixed with its rank. */
void rmoe_app_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A layer configuration of this shape, every other field at its default. */
static inline void rmoe_app_layer_shape(struct rmoe_layer_config *cfg, int64_t hidden, int64_t ffn, int64_t experts,
                                        int64_t topk, int64_t tokens)
{
	rmoe_layer_config_init(cfg);
	cfg->hidden = hidden;
	cfg->ffn = ffn;
	cfg->experts = experts;
	cfg->topk = topk;
	cfg->tokens = tokens;
}

/* The start of a multi-rank test: MPI (MPI_THREAD_MULTIPLE) and a context
 * over MPI_COMM_WORLD, *nranks its size. When a rank cannot create the
 * context the test fails (exit 1, after MPI_Finalize), saying why on every
 * rank: a library error is never a skip. The one exception is what the
 * machine lacks: StarPU finding no worker of the kinds the test's
 * environment asks for (RMOE_ENOTSUP, e.g. STARPU_NCPU=0 without a GPU)
 * skips it (77), saying so. */
static inline rmoe_ctx *rmoe_app_test_start(int *argc, char ***argv, int *nranks)
{
	int provided;
	MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_size(MPI_COMM_WORLD, nranks);
	rmoe_ctx *ctx = NULL;
	int rc = rmoe_ctx_create(&ctx, NULL);
	if (rc)
		rmoe_app_error("rmoe_ctx_create failed: %s\n", rmoe_strerror(rc));
	if ((rc = rmoe_app_agree(rc))) {
		rmoe_app_say(rc == RMOE_ENOTSUP ? "skipped: this machine has no worker of the kinds asked for\n"
		                                : "FAILED: no context, so nothing was tested\n");
		MPI_Finalize();
		exit(rc == RMOE_ENOTSUP ? 77 : 1);
	}
	return ctx;
}

/* The end of a multi-rank test: destroys ctx, prints "NAME: passed" or
 * "NAME: FAILED (N failure(s))" from the most failures of any rank, ends
 * MPI; the exit status (0 or 1). */
static inline int rmoe_app_test_end(rmoe_ctx *ctx, const char *name, int failures)
{
	rmoe_ctx_destroy(ctx);
	int total = failures;
	MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (total)
		rmoe_app_say("%s: FAILED (%d failure(s))\n", name, total);
	else
		rmoe_app_say("%s: passed\n", name);
	MPI_Finalize();
	return total ? 1 : 0;
}

/* The tensors of one layer problem on this rank: its tokens, its output
 * gradient, the replicated router (and shared expert) and its own experts. */
struct rmoe_problem {
	struct rmoe_layer_config cfg;
	int rank, nranks;
	int64_t first_expert, e_local;
	float *x, *dy;               /* [T, H] */
	float *w_router;             /* [H, E] */
	float *w_gate, *w_up;        /* [e_local, H, F] */
	float *w_down;               /* [e_local, F, H] */
	float *ws_gate, *ws_up, *ws_down; /* shared expert, when shared_ffn > 0 */
	float *w_sgate;              /* [H] its gate, when shared_gated (Qwen2-MoE) */
};

/* Skews the router so that experts [0, hot) take nearly every token: most
 * partitions then receive no pair, and ranks whose experts are cold compute
 * no rows (the tests' uneven routing). */
static inline void rmoe_problem_skew_router(struct rmoe_problem *p, int64_t hot)
{
	const int64_t H = p->cfg.hidden, E = p->cfg.experts;
	for (int64_t h = 0; h < H; h++)
		for (int64_t e = 0; e < E; e++)
			p->w_router[h * E + e] *= e < hot ? 8.0f : 0.05f;
}

/* Draws every tensor from seed, then replaces those with a file in load_dir
 * (may be NULL). Collective; 0 or an RMOE_E* code (message printed). */
int rmoe_problem_init(struct rmoe_problem *p, const struct rmoe_layer_config *cfg, uint64_t seed,
                      const char *load_dir);
void rmoe_problem_free(struct rmoe_problem *p);
int rmoe_problem_apply(const struct rmoe_problem *p, rmoe_layer *layer);

/* The outputs of one run on this rank. */
struct rmoe_results {
	float *y, *dx;               /* [T, H] */
	float *dw_router;            /* [H, E], this rank's part */
	float *dw_gate, *dw_up, *dw_down; /* owned experts */
	float *dws_gate, *dws_up, *dws_down;
	float *dw_sgate;             /* [H], this rank's part, when shared_gated */
	int32_t *topk_idx;           /* [T, K] */
};
int rmoe_results_alloc(struct rmoe_results *r, const struct rmoe_problem *p);
void rmoe_results_free(struct rmoe_results *r);
int rmoe_results_collect(struct rmoe_results *r, const struct rmoe_problem *p, rmoe_layer *layer);

/* One layer of cfg on ctx with p's tensors: create, apply, forward,
 * backward, collect into r (allocated here; the caller frees it, whatever
 * the outcome), its statistics into st (may be NULL), destroy. Every step
 * agreed over the ranks; 0 or the first RMOE_E* code. */
int rmoe_problem_run(rmoe_ctx *ctx, const struct rmoe_layer_config *cfg, const struct rmoe_problem *p,
                     struct rmoe_results *r, struct rmoe_layer_stats *st);

/* Routing skew as the memory model takes it (rmoe_mem_config.skew), from
 * every rank's top-k choices topk_idx [T, K]: the busiest ring hop's pairs
 * over the even share into *ring, the busiest rank's (all-to-all) into
 * *a2a. Collective over MPI_COMM_WORLD. */
void rmoe_problem_routing_skew(const struct rmoe_problem *p, const int32_t *topk_idx, double *ring, double *a2a);
/* The pairs every rank routes to every rank (a2a's blocks, the model's
 * rmoe_mem_config.blocks): [s * nranks + q], from topk_idx (collective);
 * then, at [nranks^2 + s * nranks + q], the distinct tokens of each block
 * (a2a-deepep's, rmoe_mem_config.block_tokens). NULL when out of memory;
 * freed by the caller. */
int64_t *rmoe_problem_a2a_blocks(const struct rmoe_problem *p, const int32_t *topk_idx);

/* Largest relative norm difference between two runs' tensors, over ranks. */
double rmoe_results_max_rel_diff(const struct rmoe_results *a, const struct rmoe_results *b,
                                 const struct rmoe_problem *p, const char **worst);

/* Compare with the reference on rank 0 (gathers everything there). Returns
 * the largest relative error over all tensors, on every rank; worst names it. */
double rmoe_results_check(const struct rmoe_results *r, const struct rmoe_problem *p,
                          const char **worst, int64_t *near_ties);

/* Activations on the rank's device (relaymoe run --io device, device_io.c):
 * x and dy in the layer's element type, uploaded by open; y and dx read
 * back into r (as float32) by read. 0 or an RMOE_E* code (reported). */
struct rmoe_device_io {
	rmoe_ctx *ctx;
	int64_t n;                   /* T*H elements */
	size_t bytes;
	void *x, *dy, *y, *dx;
};
int rmoe_device_io_open(rmoe_ctx *ctx, const struct rmoe_problem *p, struct rmoe_device_io *io);
int rmoe_device_io_read(const struct rmoe_device_io *io, const struct rmoe_problem *p, struct rmoe_results *r);
void rmoe_device_io_close(struct rmoe_device_io *io);

/* Rank 0 writes inputs and outputs as .npy into dir (created if needed). */
int rmoe_results_dump(const struct rmoe_results *r, const struct rmoe_problem *p, const char *dir);

#endif
