/* Element types on the host, at a layer's edges: float32 values to the
 * elements of a buffer (float32 or bf16), and back. */
#include <string.h>

#include "codelet.h"

void rmoe_to_elements(const float *src, void *dst, int64_t n, size_t elsize)
{
	if (elsize == 2)
		rmoe_kernel_to_bf16(n, src, dst);
	else
		memcpy(dst, src, (size_t)n * sizeof(float));
}

void rmoe_from_elements(const void *src, float *dst, int64_t n, size_t elsize)
{
	if (elsize == 2)
		rmoe_kernel_from_bf16(n, src, dst);
	else
		memcpy(dst, src, (size_t)n * sizeof(float));
}
