/* --io device (relaymoe run): the layer's activations on the rank's
 * device in the layer's element type, as a GPU training step holds them:
 * x and dy uploaded once, before the warm-up; y and dx read back once,
 * after the timed passes, for --check and --dump. So the timed passes move
 * no activation between the host and the device. */
#include <stdlib.h>

#include "device_io.h"

static size_t elsize_of(enum rmoe_dtype d)
{
	return d == RMOE_DTYPE_BF16 ? 2 : sizeof(float);
}

int rmoe_device_io_open(rmoe_ctx *ctx, const struct rmoe_problem *p, struct rmoe_device_io *io)
{
	*io = (struct rmoe_device_io){.n = p->tokens * p->cfg.hidden, .ctx = ctx};
	io->bytes = (size_t)io->n * elsize_of(p->cfg.dtype);
	/* A rank without tokens still passes buffers (one element each): no
	 * allocation or copy of 0 bytes. */
	io->alloc = io->bytes ? io->bytes : elsize_of(p->cfg.dtype);
	void **bufs[] = {&io->x, &io->dy, &io->y, &io->dx};
	int rc = 0;
	for (int i = 0; i < 4 && !rc; i++)
		rc = rmoe_ctx_alloc(ctx, RMOE_MEMORY_DEVICE, io->alloc, bufs[i]);
	void *stage = rc ? NULL : malloc(io->alloc);
	if (!rc && !stage)
		rc = RMOE_ENOMEM;
	const float *src[] = {p->x, p->dy};
	for (int i = 0; i < 2 && !rc && io->n > 0; i++) {
		rmoe_to_dtype(src[i], stage, io->n, p->cfg.dtype);
		rc = rmoe_ctx_copy(ctx, *bufs[i], RMOE_MEMORY_DEVICE, stage, RMOE_MEMORY_HOST, io->bytes);
	}
	free(stage);
	if (rc)
		rmoe_device_io_close(io);
	return rc;
}

int rmoe_device_io_read(const struct rmoe_device_io *io, const struct rmoe_problem *p, struct rmoe_results *r)
{
	if (io->n == 0)
		return 0;
	void *stage = malloc(io->bytes);
	if (!stage)
		return RMOE_ENOMEM;
	const void *from[] = {io->y, io->dx};
	float *to[] = {r->y, r->dx};
	int rc = 0;
	for (int i = 0; i < 2 && !rc; i++)
		if (!(rc = rmoe_ctx_copy(io->ctx, stage, RMOE_MEMORY_HOST, from[i], RMOE_MEMORY_DEVICE, io->bytes)))
			rmoe_from_dtype(stage, to[i], io->n, p->cfg.dtype);
	free(stage);
	return rc;
}

void rmoe_device_io_close(struct rmoe_device_io *io)
{
	void *bufs[] = {io->x, io->dy, io->y, io->dx};
	for (int i = 0; i < 4; i++)
		if (bufs[i])
			rmoe_ctx_free(io->ctx, RMOE_MEMORY_DEVICE, bufs[i], io->alloc);
	io->x = io->dy = io->y = io->dx = NULL;
}
