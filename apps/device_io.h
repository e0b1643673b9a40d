/* Activations on the rank's device (relaymoe run --io device, device_io.c):
 * x and dy in the layer's element type, uploaded by open; y and dx read
 * back into r (as float32) by read. 0 or an RMOE_E* code (reported). */
#ifndef RMOE_DEVICE_IO_H
#define RMOE_DEVICE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "problem.h"
#include "relaymoe/relaymoe.h"
#include "results.h"

struct rmoe_device_io {
	rmoe_ctx *ctx;
	int64_t n;                   /* T*H elements */
	size_t bytes;                /* of n elements */
	size_t alloc;                /* of each buffer: bytes, at least one element */
	void *x, *dy, *y, *dx;
};
int rmoe_device_io_open(rmoe_ctx *ctx, const struct rmoe_problem *p, struct rmoe_device_io *io);
int rmoe_device_io_read(const struct rmoe_device_io *io, const struct rmoe_problem *p, struct rmoe_results *r);
void rmoe_device_io_close(struct rmoe_device_io *io);

#endif
