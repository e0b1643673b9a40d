/* NumPy .npy files: float32 (int32 written too), C order, little-endian, version 1.0-3.0 headers.
 * Reads check magic, dtype, order and shape against what the caller expects
 * and say which file and which mismatch; writes go to a temporary name that is
 * renamed when complete, so a failed run leaves no partial file. */
#ifndef RMOE_NPY_H
#define RMOE_NPY_H

#include <stddef.h>
#include <stdint.h>

#define RMOE_NPY_MAXDIM 8

/* 0 on success; otherwise a negative RMOE_E* code and msg (a sentence naming
 * path and the mismatch) filled. expect_shape has ndim entries; an entry of -1
 * accepts any extent (the read one is stored back). If data is NULL only the
 * header is checked. Reading rows [row0, row0+nrows) of the first dimension
 * (nrows = -1: all) lets a rank read its own slice. */
int rmoe_npy_read_f32(const char *path, int ndim, int64_t *expect_shape, int64_t row0,
                      int64_t nrows, float *data, char *msg, size_t msglen);

/* Writes data with the given shape to path (via path.tmp.<pid>, then rename). */
int rmoe_npy_write_f32(const char *path, int ndim, const int64_t *shape, const float *data,
                       char *msg, size_t msglen);
/* The same for int32 data (the routing's expert indices of a dump). */
int rmoe_npy_write_i32(const char *path, int ndim, const int64_t *shape, const int32_t *data,
                       char *msg, size_t msglen);

/* Parses an in-memory .npy header (for the reader and its fuzzer): fills ndim,
 * shape and the data offset; 0 or a negative code with msg. */
int rmoe_npy_parse_header(const unsigned char *buf, size_t len, int *ndim, int64_t *shape,
                          size_t *data_offset, char *msg, size_t msglen);

#endif
