/* The argument structs tasks carry (STARPU_CL_ARGS: StarPU frees them):
 * the sizes and construction of those with a variable tail, and the checks
 * of what the row and expert codelets find in them. */
#include <stdlib.h>
#include <string.h>

#include "codelet.h"

size_t rmoe_expert_args_size(int64_t n_experts)
{
	if (n_experts < 0)
		n_experts = 0;
	return sizeof(struct rmoe_expert_args) + (size_t)n_experts * sizeof(int64_t);
}

struct rmoe_expert_args *rmoe_expert_args_from(const struct rmoe_expert_shape *s)
{
	struct rmoe_expert_args *a = calloc(1, rmoe_expert_args_size(s->n_experts));
	if (!a)
		return NULL;
	a->hidden = s->hidden;
	a->ffn = s->ffn;
	a->n_experts = s->n_experts;
	a->rows = s->rows;
	memcpy(a->rows_per_expert, s->rows_per_expert, (size_t)s->n_experts * sizeof(int64_t));
	return a;
}

size_t rmoe_sort_args_size(int64_t n_peers, int64_t n_experts)
{
	if (n_peers < 0 || n_experts < 0)
		n_peers = n_experts = 0;
	return sizeof(struct rmoe_sort_args) + (size_t)n_peers * (size_t)n_experts * sizeof(int64_t);
}

int rmoe_cl_rows_unpack(const char *op, void *buffers[], const struct rmoe_rows_args *a, const char *roles,
                        const char *const *names, int host, void **ptr)
{
	const int64_t H = a->hidden, K = a->topk;
	if (!(H >= 1 && K >= 1 && a->first >= 0 && a->count >= 0))
		return rmoe_cl_fail(op, "bad arguments first=%lld count=%lld H=%lld K=%lld", (long long)a->first,
		                    (long long)a->count, (long long)H, (long long)K);
	const int nspec = (int)strlen(roles), ipairs = (int)(strchr(roles, 'P') - roles);
	struct starpu_task *task = starpu_task_get_current();
	if (!task || (int)STARPU_TASK_GET_NBUFFERS(task) <= ipairs)
		return rmoe_cl_fail(op, "no pair order buffer (buffer %d)", ipairs);
	const int64_t n_pairs = (int64_t)STARPU_VECTOR_GET_NX(buffers[ipairs]);
	if (n_pairs % K != 0)
		return rmoe_cl_fail(op, "%lld pairs, not a multiple of K=%lld", (long long)n_pairs, (long long)K);
	if (a->first + a->count > n_pairs)
		return rmoe_cl_fail(op, "slice [%lld, %lld) beyond %lld pairs", (long long)a->first,
		                    (long long)(a->first + a->count), (long long)n_pairs);
	struct rmoe_cl_buffer spec[8];
	for (int i = 0; i < nspec && i < 8; i++) {
		int64_t n = roles[i] == 'T' ? n_pairs / K * H : roles[i] == 'R' ? a->count * H : n_pairs;
		spec[i] = (struct rmoe_cl_buffer)RMOE_CL_BUF(names[i], n);
	}
	if (rmoe_cl_unpack(op, buffers, spec, nspec, ptr))
		return -1;
	int64_t bad = host ? rmoe_kernel_first_bad_pair(ptr[ipairs], a->first, a->count, n_pairs) : -1;
	if (bad >= 0)
		return rmoe_cl_fail(op, "pair_order[%lld] = %d, not a pair of %lld", (long long)(a->first + bad),
		                    (int)((const int32_t *)ptr[ipairs])[a->first + bad], (long long)n_pairs);
	return 0;
}

int rmoe_expert_args_check(const char *op, const struct rmoe_expert_args *a)
{
	int ok = a->n_experts >= 0 && rmoe_cl_dim_ok(a->hidden) && rmoe_cl_dim_ok(a->ffn) && rmoe_cl_dim_ok(a->rows);
	int64_t sum = 0;
	for (int64_t e = 0; ok && e < a->n_experts; e++) {
		ok = a->rows_per_expert[e] >= 0;
		sum += a->rows_per_expert[e];
	}
	if (ok && sum == a->rows)
		return 0;
	return rmoe_cl_fail(op, "bad shape H=%lld F=%lld experts=%lld rows=%lld (or rows_per_expert)",
	                    (long long)a->hidden, (long long)a->ffn, (long long)a->n_experts, (long long)a->rows);
}
