/* The argument structs tasks carry (STARPU_CL_ARGS: StarPU frees them):
 * copies, and the sizes and construction of those with a variable tail. */
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

void *rmoe_cl_args_dup(const void *args, size_t size)
{
	void *a = malloc(size);
	if (a)
		memcpy(a, args, size);
	return a;
}
