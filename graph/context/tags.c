/* One allocator for every StarPU-MPI tag relaymoe uses.
 *
 * Tags live in [tag_first, tag_last] (the upper half of what StarPU-MPI
 * accepts, STARPU_MPI_TAG_UB). Each pass reserves a block; ranks reserve in
 * the same order (every layer call is collective), so blocks agree without
 * communication. When the window is exhausted it wraps: a pass completes all
 * its transfers before returning, so an old block is free again. */
#include <starpu_mpi.h>

#include "rmoe_ctx.h"

void rmoe_tags_init(rmoe_ctx *ctx)
{
	int64_t *ub = NULL;
	int ubflag = 0;
	starpu_mpi_comm_get_attr(ctx->comm, STARPU_MPI_TAG_UB, &ub, &ubflag);
	int64_t tag_ub = (ubflag && ub) ? *ub : 32767; /* the MPI standard's guaranteed minimum */
	ctx->tag_first = tag_ub / 2;
	ctx->tag_last = tag_ub;
	ctx->tag_next = ctx->tag_first;
}

int rmoe_tags_reserve(rmoe_ctx *ctx, int64_t count, int64_t *base)
{
	int64_t span = ctx->tag_last - ctx->tag_first + 1;
	if (count <= 0 || count > span)
		return rmoe_error(RMOE_EINVAL,
		                  "a pass needs %lld StarPU-MPI tags but only %lld fit below STARPU_MPI_TAG_UB",
		                  (long long)count, (long long)span);
	if (ctx->tag_next + count - 1 > ctx->tag_last)
		ctx->tag_next = ctx->tag_first;
	*base = ctx->tag_next;
	ctx->tag_next += count;
	return 0;
}
