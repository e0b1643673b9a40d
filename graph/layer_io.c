/* A layer's weights and gradients in and out of the application's arrays,
 * its routing and statistics, and the finite check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_codelets.h"
#include "rmoe_collective.h"
#include "rmoe_layer_impl.h"
#include "rmoe_scheduler.h"

int rmoe_copy_handle(starpu_data_handle_t h, void *dst, const void *src, size_t bytes, int write)
{
	int ret = starpu_data_acquire(h, write ? STARPU_W : STARPU_R);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_data_acquire failed (%d)", ret);
	memcpy(dst, src, bytes);
	starpu_data_release(h);
	return 0;
}

int rmoe_write_elements(starpu_data_handle_t h, void *buf, const float *src, int64_t n, size_t elsize)
{
	int ret = starpu_data_acquire(h, STARPU_W);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_data_acquire failed (%d)", ret);
	rmoe_to_elements(src, buf, n, elsize);
	starpu_data_release(h);
	return 0;
}

void rmoe_round_to_dtype(float *values, int64_t n, enum rmoe_dtype dtype)
{
	if (dtype != RMOE_DTYPE_BF16 || !values)
		return;
	uint16_t b[256];
	for (int64_t i = 0; i < n; i += 256) {
		int64_t m = n - i < 256 ? n - i : 256;
		rmoe_to_elements(values + i, b, m, sizeof(b[0]));
		rmoe_from_elements(b, values + i, m, sizeof(b[0]));
	}
}

void rmoe_to_dtype(const float *src, void *dst, int64_t n, enum rmoe_dtype dtype)
{
	if (src && dst)
		rmoe_to_elements(src, dst, n, dtype == RMOE_DTYPE_BF16 ? 2 : sizeof(float));
}

void rmoe_from_dtype(const void *src, float *dst, int64_t n, enum rmoe_dtype dtype)
{
	if (src && dst)
		rmoe_from_elements(src, dst, n, dtype == RMOE_DTYPE_BF16 ? 2 : sizeof(float));
}

static int check_owned(const rmoe_layer *L, int64_t e)
{
	if (e < L->first_expert || e >= L->first_expert + L->e_local)
		return rmoe_error(RMOE_EINVAL, "expert %lld is not owned by rank %d: expected %lld <= e < %lld",
		                  (long long)e, L->ctx->rank, (long long)L->first_expert,
		                  (long long)(L->first_expert + L->e_local));
	return 0;
}

/* gate, up and down of one expert (or the shared one: n = 1, le = 0) in a
 * buffer of elements of elsize bytes laid out gate [n][H][F] | up [n][H][F]
 * | down [n][F][H], to or from the application's three float32 arrays. */
static int triple_io(starpu_data_handle_t h, void *buf, size_t elsize, int64_t n, int64_t le, int64_t hf, float *g,
                     float *u, float *d, int write)
{
	char *base = buf;
	char *p[3] = {base + (size_t)(le * hf) * elsize, base + (size_t)((n + le) * hf) * elsize,
	              base + (size_t)((2 * n + le) * hf) * elsize};
	float *q[3] = {g, u, d};
	int ret = starpu_data_acquire(h, write ? STARPU_RW : STARPU_R);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_data_acquire failed (%d)", ret);
	for (int i = 0; i < 3; i++) {
		if (write)
			rmoe_to_elements(q[i], p[i], hf, elsize);
		else
			rmoe_from_elements(p[i], q[i], hf, elsize);
	}
	starpu_data_release(h);
	return 0;
}

static int expert_io(const rmoe_layer *L, starpu_data_handle_t h, void *part, int64_t e, float *g, float *u,
                     float *d, int write)
{
	int rc = check_owned(L, e);
	if (rc)
		return rc;
	if (!g || !u || !d)
		return rmoe_error(RMOE_EINVAL, "expert %lld: gate, up and down pointers must not be NULL", (long long)e);
	return triple_io(h, part, L->act, L->e_local, e - L->first_expert, L->H * L->F, g, u, d, write);
}

static int shared_io(const rmoe_layer *L, starpu_data_handle_t h, void *buf, float *g, float *u, float *d,
                     int write)
{
	if (L->Fs <= 0)
		return rmoe_error(RMOE_ESTATE, "the layer has no shared expert (shared_ffn = 0)");
	if (!g || !u || !d)
		return rmoe_error(RMOE_EINVAL, "shared expert: gate, up and down must not be NULL");
	return triple_io(h, buf, L->act, 1, 0, L->H * L->Fs, g, u, d, write);
}

int rmoe_layer_set_router(rmoe_layer *L, const float *w)
{
	if (!L || !w)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_set_router: layer and weights must not be NULL");
	return rmoe_copy_handle(L->h_w_router, L->w_router, w, (size_t)(L->H * L->E) * sizeof(float), 1);
}

int rmoe_layer_get_router(const rmoe_layer *L, float *w)
{
	if (!L || !w)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_get_router: layer and output must not be NULL");
	return rmoe_copy_handle(L->h_w_router, w, L->w_router, (size_t)(L->H * L->E) * sizeof(float), 0);
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

/* The gated shared expert's gate [H] (w) or its gradient (dw), to or from
 * the application's array. */
static int shared_gate_io(const rmoe_layer *L, starpu_data_handle_t h, float *buf, float *v, int write,
                          const char *call)
{
	if (!L || !v)
		return rmoe_error(RMOE_EINVAL, "%s: layer and array must not be NULL", call);
	if (L->Fs <= 0 || !L->cfg.shared_gated)
		return rmoe_error(RMOE_ESTATE, "%s: the layer's shared expert is not gated (shared_ffn = %lld, "
		                  "shared_gated = %d): expected shared_ffn > 0 and shared_gated = 1", call,
		                  (long long)L->Fs, L->cfg.shared_gated);
	return write ? rmoe_copy_handle(h, buf, v, (size_t)L->H * sizeof(float), 1)
	             : rmoe_copy_handle(h, v, buf, (size_t)L->H * sizeof(float), 0);
}

int rmoe_layer_set_shared_expert_gate(rmoe_layer *L, const float *w)
{
	int rc = shared_gate_io(L, L ? L->h_w_sgate : NULL, L ? L->w_sgate : NULL, (float *)w, 1,
	                        "rmoe_layer_set_shared_expert_gate");
	if (!rc)
		L->have_shared_gate = 1;
	return rc;
}

int rmoe_layer_get_shared_expert_gate(const rmoe_layer *L, float *w)
{
	return shared_gate_io(L, L ? L->h_w_sgate : NULL, L ? L->w_sgate : NULL, w, 0,
	                      "rmoe_layer_get_shared_expert_gate");
}

int rmoe_layer_get_grad_shared_expert_gate(const rmoe_layer *L, float *dw)
{
	return shared_gate_io(L, L ? L->h_dw_sgate : NULL, L ? L->dw_sgate : NULL, dw, 0,
	                      "rmoe_layer_get_grad_shared_expert_gate");
}

int rmoe_layer_get_grad_router(const rmoe_layer *L, float *dw)
{
	if (!L || !dw)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_get_grad_router: layer and output must not be NULL");
	return rmoe_copy_handle(L->h_dw_router, dw, L->dw_router, (size_t)(L->H * L->E) * sizeof(float), 0);
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
		rc = rmoe_copy_handle(L->h_topk_idx, idx, L->topk_idx, tk * sizeof(int32_t), 0);
	if (w && !rc)
		rc = rmoe_copy_handle(L->h_topk_w, w, L->topk_w, tk * sizeof(float), 0);
	if (probs && !rc)
		rc = rmoe_copy_handle(L->h_probs, probs, L->probs, (size_t)(L->T * L->E) * sizeof(float), 0);
	return rc;
}

int rmoe_layer_get_stats(const rmoe_layer *L, struct rmoe_layer_stats *s)
{
	if (!L || !s)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_get_stats: layer and stats must not be NULL");
	*s = L->stats;
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

int rmoe_layer_stripes(const rmoe_layer *L)
{
	return L ? rmoe_ring_stripes_most(L->stripe_count, L->N) : 0;
}

/* ---- finite checks ------------------------------------------------------------ */

/* The first NaN or infinity of a rows x cols tensor, named with its index. */
static int scan_finite(const float *v, int64_t rows, int64_t cols, const char *name, const char *note)
{
	const int64_t n = rows * cols;
	for (int64_t i = 0; i < n; i++)
		if (!isfinite(v[i]))
			return rmoe_error(RMOE_ENONFINITE, "%s[%lld, %lld] = %g%s: expected finite values", name,
			                  (long long)(i / cols), (long long)(i % cols), (double)v[i], note);
	return 0;
}

/* gate, up and down of expert le of an n-expert buffer of elements of
 * elsize bytes, named by their global index e (-1: the shared expert). */
static int scan_triple(const void *buf, size_t elsize, int64_t n, int64_t le, int64_t H, int64_t F, int64_t e)
{
	const int64_t hf = H * F;
	float *f = malloc((size_t)hf * sizeof(float));
	if (!f)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	const char *part[3] = {"gate", "up", "down"};
	const int64_t at[3] = {le * hf, (n + le) * hf, (2 * n + le) * hf};
	int rc = 0;
	for (int i = 0; i < 3 && !rc; i++) {
		char name[48];
		if (e >= 0)
			snprintf(name, sizeof(name), "w_%s[%lld]", part[i], (long long)e);
		else
			snprintf(name, sizeof(name), "w_shared_%s", part[i]);
		rmoe_from_elements((const char *)buf + (size_t)at[i] * elsize, f, hf, elsize);
		rc = scan_finite(f, i < 2 ? H : F, i < 2 ? F : H, name, "");
	}
	free(f);
	return rc;
}

int rmoe_layer_find_nonfinite(struct rmoe_layer *L, struct rmoe_wait *w, const float *x, const float *dy, const float *dprobs,
                              int weights)
{
	/* x is the next forward's input, dy and dprobs the last forward's. */
	char rows[80], next[80];
	snprintf(rows, sizeof(rows), " (row of this rank's %lld tokens)", (long long)L->T);
	snprintf(next, sizeof(next), " (row of this rank's %lld tokens)", (long long)L->next_T);
	int rc = 0;
	if ((x && (rc = scan_finite(x, L->next_T, L->H, "x", next))) ||
	    (dy && (rc = scan_finite(dy, L->T, L->H, "dy", rows))) ||
	    (dprobs && (rc = scan_finite(dprobs, L->T, L->E, "dprobs", rows))) || !weights)
		return rc;
	if ((rc = rmoe_acquire_bounded(w, L->h_w_router, STARPU_MAIN_RAM, STARPU_R, "the router weights")))
		return rc;
	rc = scan_finite(L->w_router, L->H, L->E, "w_router", "");
	starpu_data_release(L->h_w_router);
	if (rc || (rc = rmoe_acquire_bounded(w, L->h_w_part, STARPU_MAIN_RAM, STARPU_R, "the expert weights")))
		return rc;
	for (int64_t le = 0; le < L->e_local && !rc; le++)
		rc = scan_triple(L->w_part, L->act, L->e_local, le, L->H, L->F, L->first_expert + le);
	starpu_data_release(L->h_w_part);
	if (rc || L->Fs <= 0 || !L->have_shared_weights ||
	    (rc = rmoe_acquire_bounded(w, L->h_ws, STARPU_MAIN_RAM, STARPU_R, "the shared expert weights")))
		return rc;
	rc = scan_triple(L->ws, L->act, 1, 0, L->H, L->Fs, -1);
	starpu_data_release(L->h_ws);
	if (rc || !L->cfg.shared_gated || !L->have_shared_gate ||
	    (rc = rmoe_acquire_bounded(w, L->h_w_sgate, STARPU_MAIN_RAM, STARPU_R, "the shared expert's gate")))
		return rc;
	rc = scan_finite(L->w_sgate, 1, L->H, "w_shared_expert_gate", "");
	starpu_data_release(L->h_w_sgate);
	return rc;
}

int rmoe_layer_check_finite(rmoe_layer *L, const float *x, const float *dy)
{
	if (!L)
		return rmoe_error(RMOE_EINVAL, "rmoe_layer_check_finite: layer must not be NULL");
	struct rmoe_wait w = rmoe_wait_make(L->cfg.wait_timeout);
	return rmoe_agree_first(&w, L->ctx->comm, rmoe_layer_find_nonfinite(L, &w, x, dy, NULL, 1), "the finite check");
}
