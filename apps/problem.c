/* The tensors of a layer problem: drawn from a seed or read from .npy
 * files, handed to a layer; and its routing as the memory model takes it. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "messages.h"
#include "npy.h"
#include "problem.h"
#include "rmoe_config.h"
#include "seeded.h"

float *rmoe_app_falloc(int64_t n)
{
#ifdef RMOE_SIMGRID
	/* Simulated: no kernel reads or writes the tensors; SMPI's shared
	 * malloc folds every rank's copy into one small area. */
	return SMPI_SHARED_MALLOC((size_t)(n > 0 ? n : 1) * sizeof(float));
#else
	return malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
#endif
}

/* Reads path (if it exists) into dst: rows [row0, row0+nrows) of a file of
 * the given shape. 1 if read, 0 if absent, negative on a bad file. */
static int load_one(const char *dir, const char *name, int ndim, const int64_t *shape, int64_t row0,
                    int64_t nrows, float *dst)
{
	if (!dir)
		return 0;
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	struct stat st;
	if (stat(path, &st) != 0)
		return 0;
	int64_t expect[RMOE_NPY_MAXDIM];
	memcpy(expect, shape, (size_t)ndim * sizeof(int64_t));
	char msg[512];
	int rc = rmoe_npy_read_f32(path, ndim, expect, row0, nrows, dst, msg, sizeof(msg));
	if (rc) {
		rmoe_app_error("%s", msg);
		return rc;
	}
	return 1;
}

/* The problem's tensors, a row each: its array and elements on this rank;
 * its seeded stream, first element and scale (every rank draws its slice of
 * the same global tensor); its file under --load, the file's shape and the
 * rows this rank reads (nrows -1: all). One table for allocating, drawing,
 * loading and freeing them. */
struct tensor {
	float **ptr;
	int64_t n;
	int stream;
	int64_t offset;
	float scale;
	const char *file;
	int ndim;
	int64_t shape[3], row0, nrows;
};

/* The rows of p's tensors into t (room for PROBLEM_TENSORS): those the
 * layer has, or with all every array p may own (to free). Their count. */
#define PROBLEM_TENSORS 10
static int tensors(struct rmoe_problem *p, struct tensor *t, int all)
{
	const int64_t H = p->cfg.hidden, F = p->cfg.ffn, E = p->cfg.experts, T = p->tokens, TT = p->total_tokens,
	              Fs = p->cfg.shared_ffn, el = p->e_local, HF = H * F;
	const float sh = 1.0f / sqrtf((float)H), sf = 1.0f / sqrtf((float)F), ss = Fs > 0 ? 1.0f / sqrtf((float)Fs) : 0;
	const int64_t own = p->token0 * H, first = p->first_expert;
	int n = 0;
	t[n++] = (struct tensor){&p->x, T * H, RMOE_STREAM_X, own, 1.0f, "x.npy", 2, {TT, H}, p->token0, T};
	t[n++] = (struct tensor){&p->dy, T * H, RMOE_STREAM_DY, own, 1.0f, "dy.npy", 2, {TT, H}, p->token0, T};
	t[n++] = (struct tensor){&p->w_router, H * E, RMOE_STREAM_W_ROUTER, 0, sh, "w_router.npy", 2, {H, E}, 0, -1};
	t[n++] = (struct tensor){&p->w_gate, el * HF, RMOE_STREAM_W_GATE, first * HF, sh, "w_gate.npy", 3, {E, H, F},
	                         first, el};
	t[n++] = (struct tensor){&p->w_up, el * HF, RMOE_STREAM_W_UP, first * HF, sh, "w_up.npy", 3, {E, H, F}, first, el};
	t[n++] = (struct tensor){&p->w_down, el * HF, RMOE_STREAM_W_DOWN, first * HF, sf, "w_down.npy", 3, {E, F, H},
	                         first, el};
	if (all || Fs > 0) {
		t[n++] = (struct tensor){&p->ws_gate, H * Fs, RMOE_STREAM_WS_GATE, 0, sh, "w_shared_gate.npy", 2, {H, Fs},
		                         0, -1};
		t[n++] = (struct tensor){&p->ws_up, H * Fs, RMOE_STREAM_WS_UP, 0, sh, "w_shared_up.npy", 2, {H, Fs}, 0, -1};
		t[n++] = (struct tensor){&p->ws_down, H * Fs, RMOE_STREAM_WS_DOWN, 0, ss, "w_shared_down.npy", 2, {Fs, H},
		                         0, -1};
	}
	if (all || (Fs > 0 && p->cfg.shared_gated))
		t[n++] = (struct tensor){&p->w_sgate, H, RMOE_STREAM_W_SHARED_EXPERT_GATE, 0, sh,
		                         "w_shared_expert_gate.npy", 1, {H}, 0, -1};
	return n;
}

/* Room for every tensor of p; collective, 0 or RMOE_ENOMEM on every rank. */
static int problem_alloc(struct rmoe_problem *p)
{
	struct tensor t[PROBLEM_TENSORS];
	int n = tensors(p, t, 0), rc = 0;
	for (int i = 0; i < n; i++)
		if (!(*t[i].ptr = rmoe_app_falloc(t[i].n)))
			rc = RMOE_ENOMEM;
	if (rc)
		rmoe_app_error("out of host memory for the layer's tensors (tokens=%lld hidden=%lld)",
		               (long long)p->tokens, (long long)p->cfg.hidden);
	return rmoe_app_agree(rc);
}

/* Seeded: every rank draws its slice of the same global tensors. */
static void problem_draw(struct rmoe_problem *p, uint64_t seed)
{
	struct tensor t[PROBLEM_TENSORS];
	int n = tensors(p, t, 0);
	for (int i = 0; i < n; i++)
		rmoe_seeded_uniform(*t[i].ptr, t[i].n, seed, t[i].stream, t[i].offset, t[i].scale);
}

/* The tensors with a file in load_dir replaced by its rows for this rank;
 * collective, 0 or an RMOE_E* code on every rank. */
static int problem_load(struct rmoe_problem *p, const char *load_dir)
{
	struct stat st;
	if (stat(load_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		rmoe_app_error("--load %s: not a readable directory", load_dir);
		return rmoe_app_agree(RMOE_EIO);
	}
	struct tensor t[PROBLEM_TENSORS];
	int n = tensors(p, t, 0), rc = 0;
	for (int i = 0; i < n && !rc; i++) {
		int r = load_one(load_dir, t[i].file, t[i].ndim, t[i].shape, t[i].row0, t[i].nrows, *t[i].ptr);
		if (r < 0)
			rc = r;
		/* x and dy are the first two: their rows are every rank's tokens */
		if (r == RMOE_EFORMAT && i < 2)
			rmoe_app_error("%s holds every rank's tokens as rows: expected %lld (this rank's %lld from row %lld)",
			               t[i].file, (long long)p->total_tokens, (long long)p->tokens, (long long)p->token0);
	}
	return rmoe_app_agree(rc);
}

/* Every rank's count (rank_tokens, or cfg's tokens each), this rank's rows
 * of the global token tensors; 0 or RMOE_ENOMEM (not agreed). */
static int problem_tokens(struct rmoe_problem *p, const int64_t *rank_tokens)
{
	if (!(p->rank_tokens = malloc((size_t)p->nranks * sizeof(int64_t))))
		return RMOE_ENOMEM;
	for (int r = 0; r < p->nranks; r++) {
		p->rank_tokens[r] = rank_tokens ? rank_tokens[r] : p->cfg.tokens;
		if (r < p->rank)
			p->token0 += p->rank_tokens[r];
		p->total_tokens += p->rank_tokens[r];
	}
	p->tokens = p->rank_tokens[p->rank];
	return 0;
}

int rmoe_problem_init(struct rmoe_problem *p, const struct rmoe_layer_config *cfg, uint64_t seed,
                      const char *load_dir)
{
	return rmoe_problem_init_tokens(p, cfg, NULL, seed, load_dir);
}

int rmoe_problem_init_tokens(struct rmoe_problem *p, const struct rmoe_layer_config *cfg,
                             const int64_t *rank_tokens, uint64_t seed, const char *load_dir)
{
	memset(p, 0, sizeof(*p));
	p->cfg = *cfg;
	MPI_Comm_rank(MPI_COMM_WORLD, &p->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &p->nranks);
	p->e_local = cfg->experts / p->nranks;
	p->first_expert = p->rank * p->e_local;
	p->kept = calloc(1, sizeof(*p->kept));
	int rc = problem_tokens(p, rank_tokens);
	if (rc)
		rmoe_app_error("out of host memory for the problem");
	if ((rc = rmoe_app_agree(rc)))
		return rc;
	rc = problem_alloc(p);
	if (!rc && !p->kept)
		rmoe_app_error("out of host memory for the problem");
	if (!rc)
		rc = rmoe_app_agree(p->kept ? 0 : RMOE_ENOMEM);
	if (rc)
		return rc;
#ifdef RMOE_SIMGRID
	/* Nothing computes on the values in a simulation: drawing them would
	 * only cost host time. */
	return 0;
#endif
	problem_draw(p, seed);
	return load_dir ? problem_load(p, load_dir) : 0;
}

void rmoe_problem_free(struct rmoe_problem *p)
{
	struct tensor t[PROBLEM_TENSORS];
	int n = tensors(p, t, 1);
	for (int i = 0; i < n; i++)
		free(*t[i].ptr);
	if (p->kept && p->kept->release)
		p->kept->release(p->kept->data);
	free(p->kept);
	free(p->rank_tokens);
	memset(p, 0, sizeof(*p));
}

int rmoe_problem_apply(const struct rmoe_problem *p, rmoe_layer *layer)
{
	const int64_t HF = p->cfg.hidden * p->cfg.ffn;
	int rc = rmoe_layer_set_tokens(layer, p->tokens);
	if (!rc)
		rc = rmoe_layer_set_router(layer, p->w_router);
	for (int64_t e = 0; e < p->e_local && !rc; e++)
		rc = rmoe_layer_set_expert(layer, p->first_expert + e, p->w_gate + e * HF, p->w_up + e * HF,
		                           p->w_down + e * HF);
	if (!rc && p->cfg.shared_ffn > 0)
		rc = rmoe_layer_set_shared(layer, p->ws_gate, p->ws_up, p->ws_down);
	if (!rc && p->w_sgate)
		rc = rmoe_layer_set_shared_expert_gate(layer, p->w_sgate);
	return rc;
}

/* Routing skew as the memory model takes it, from every rank's top-k
 * choices: all[r * Q + q] = pairs of rank r's tokens routed to partition q.
 * The busiest ring hop (one rank's pairs for one partition) against the
 * even share of the largest count (with equal counts, the even share), and
 * the most pairs a rank receives (the all-to-all's) against the mean. */
void rmoe_problem_routing_skew(const struct rmoe_problem *p, const int32_t *topk_idx, double *ring,
                         double *a2a)
{
	/* The ring's hops visit N*parts partitions (parts per rank, --partitions). */
	const int N = p->nranks, parts = p->cfg.partitions > 1 ? (int)p->cfg.partitions : 1, Q = N * parts;
	const int64_t K = p->cfg.topk, P = p->tokens * K, per = p->e_local / parts;
	int64_t *mine = calloc((size_t)Q, sizeof(int64_t)), *all = calloc((size_t)N * Q, sizeof(int64_t));
	for (int64_t i = 0; i < P; i++)
		mine[topk_idx[i] / per]++;
	MPI_Allgather(mine, Q, MPI_INT64_T, all, Q, MPI_INT64_T, MPI_COMM_WORLD);
	/* Against the largest count's share: the model gives the rank of that
	 * count the busiest hop's rows and block (rmoe_mem_config.rank_tokens),
	 * a smaller one its part; equal counts are the even share. */
	int64_t rank = 0, most = 0, busiest = 0;
	for (int r = 0; r < N; r++) {
		most = p->rank_tokens[r] > most ? p->rank_tokens[r] : most;
		for (int g = 0; g < Q; g++)
			busiest = all[r * Q + g] > busiest ? all[r * Q + g] : busiest;
	}
	const double hop = most > 0 ? (double)busiest * Q / (double)(most * K) : 1.0;
	for (int q = 0; q < N; q++) {
		int64_t col = 0;
		for (int r = 0; r < N; r++)
			for (int g = q * parts; g < (q + 1) * parts; g++)
				col += all[r * Q + g];
		rank = col > rank ? col : rank;
	}
	const double mean = (double)(p->total_tokens * K) / N;
	*ring = fmin((double)Q, fmax(1.0, hop));
	*a2a = mean > 0 ? fmax(1.0, (double)rank / mean) : 1.0;
	free(mine);
	free(all);
}

int64_t *rmoe_problem_a2a_blocks(const struct rmoe_problem *p, const int32_t *topk_idx)
{
	const int N = p->nranks;
	const int64_t P = p->tokens * p->cfg.topk;
	const int64_t K = p->cfg.topk;
	int64_t *mine = calloc((size_t)(2 * N), sizeof(int64_t)), *all = calloc((size_t)(2 * N * N), sizeof(int64_t));
	int64_t *gathered = calloc((size_t)(2 * N * N), sizeof(int64_t));
	int ok = mine && all && gathered;
	for (int64_t i = 0; ok && i < P; i++) {
		const int64_t q = topk_idx[i] / p->e_local;
		mine[q]++;
		/* a token counted once per rank, at its first pair there */
		int seen = 0;
		for (int64_t j = i - i % K; j < i && !seen; j++)
			seen = topk_idx[j] / p->e_local == q;
		mine[N + q] += !seen;
	}
	/* every rank takes part, whatever its allocations gave */
	MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (ok) {
		MPI_Allgather(mine, 2 * N, MPI_INT64_T, gathered, 2 * N, MPI_INT64_T, MPI_COMM_WORLD);
		for (int s = 0; s < N; s++)
			for (int q = 0; q < N; q++) {
				all[s * N + q] = gathered[s * 2 * N + q];
				all[N * N + s * N + q] = gathered[s * 2 * N + N + q];
			}
	}
	free(mine);
	free(gathered);
	if (!ok) {
		free(all);
		return NULL;
	}
	return all;
}
