/* Fuzz target: the .npy header parser (rmoe_npy_parse_header) on the raw
 * bytes, then the whole reader (rmoe_npy_read_f32) on the same bytes as a
 * file, as --load would meet them. Either answers 0 with a shape that fits
 * the bytes, or an error code with a message; nothing else. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "npy.h"
#include "relaymoe/relaymoe.h"

/* One scratch file name per process, in memory (/dev/shm) when possible,
 * which keeps the fuzzer fast; the file lives only while an input is read
 * (libFuzzer ends without running atexit handlers). */
static const char *scratch_path(void)
{
	static char path[256];
	if (!path[0]) {
		const char *dir = getenv("TMPDIR");
		if (!dir || !*dir)
			dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
		snprintf(path, sizeof(path), "%s/rmoe_fuzz_npy.%ld.npy", dir, (long)getpid());
	}
	return path;
}

static void read_file(const char *path, int ndim, const int64_t *shape)
{
	char msg[512];
	int64_t expect[RMOE_NPY_MAXDIM];
	for (int i = 0; i < RMOE_NPY_MAXDIM; i++)
		expect[i] = -1;
	/* The header alone, with any extents: must agree with the parser. */
	int want = ndim >= 0 ? ndim : 2;
	msg[0] = '\0';
	int rc = rmoe_npy_read_f32(path, want, expect, 0, -1, NULL, msg, sizeof(msg));
	if (rc)
		RMOE_FUZZ_REQUIRE(msg[0] != '\0' && strlen(msg) < sizeof(msg));
	if (ndim < 0 || rc)
		return;
	for (int i = 0; i < ndim; i++)
		RMOE_FUZZ_REQUIRE(expect[i] == shape[i]);
	/* The data too, when small: every row, then the last row alone. */
	int64_t elements = 1;
	for (int i = 0; i < ndim; i++)
		elements *= shape[i];
	if (elements > (1 << 16))
		return;
	float *buf = malloc((size_t)(elements > 0 ? elements : 1) * sizeof(float));
	if (!buf)
		return;
	for (int i = 0; i < ndim; i++)
		expect[i] = shape[i];
	rc = rmoe_npy_read_f32(path, ndim, expect, 0, -1, buf, msg, sizeof(msg));
	if (rc)
		RMOE_FUZZ_REQUIRE(msg[0] != '\0');
	if (ndim > 0 && shape[0] > 0)
		(void)rmoe_npy_read_f32(path, ndim, expect, shape[0] - 1, 1, buf, msg, sizeof(msg));
	free(buf);
}

static void check_reader(const uint8_t *data, size_t size, int ndim, const int64_t *shape)
{
	const char *path = scratch_path();
	FILE *f = fopen(path, "wb");
	if (!f)
		return;
	size_t written = fwrite(data, 1, size, f);
	fclose(f);
	if (written == size)
		read_file(path, ndim, shape);
	unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > (1 << 16))
		return 0;
	/* A private copy: the parser must not read past size (ASan sees it). */
	unsigned char *copy = malloc(size ? size : 1);
	if (!copy)
		return 0;
	memcpy(copy, data, size);
	int ndim = -1;
	int64_t shape[RMOE_NPY_MAXDIM];
	size_t offset = 0;
	char msg[256];
	msg[0] = '\0';
	int rc = rmoe_npy_parse_header(copy, size, &ndim, shape, &offset, msg, sizeof(msg));
	if (rc == 0) {
		RMOE_FUZZ_REQUIRE(ndim >= 0 && ndim <= RMOE_NPY_MAXDIM);
		RMOE_FUZZ_REQUIRE(offset <= size);
		/* every extent, and the product of the non-zero ones (which bounds
		 * any product a reader forms), within 2^62 */
		int64_t elements = 1;
		for (int i = 0; i < ndim; i++) {
			RMOE_FUZZ_REQUIRE(shape[i] >= 0 && shape[i] <= (INT64_C(1) << 62));
			RMOE_FUZZ_REQUIRE(shape[i] == 0 || elements <= (INT64_C(1) << 62) / shape[i]);
			if (shape[i] > 0)
				elements *= shape[i];
		}
	} else {
		RMOE_FUZZ_REQUIRE(rc == RMOE_EFORMAT);
		RMOE_FUZZ_REQUIRE(msg[0] != '\0');
		ndim = -1;
	}
	/* Tiny message buffers are cut, never overrun. */
	char tiny[4];
	int tiny_ndim;
	int64_t tiny_shape[RMOE_NPY_MAXDIM];
	size_t tiny_offset;
	RMOE_FUZZ_REQUIRE(rmoe_npy_parse_header(copy, size, &tiny_ndim, tiny_shape, &tiny_offset, tiny,
	                                        sizeof(tiny)) == rc);
	check_reader(copy, size, rc == 0 ? ndim : -1, shape);
	free(copy);
	return 0;
}
