/* .npy files (NumPy format specification, versions 1.0 to 3.0), restricted to
 * the one dtype relaymoe exchanges: float32, little-endian, C order.
 * The header parser takes untrusted bytes: it never reads past len, bounds
 * every token, and checks every shape product before it is formed. */
#define _FILE_OFFSET_BITS 64
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "npy.h"
#include "relaymoe/relaymoe.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c stores host floats as '<f4' and so needs a little-endian host"
#endif
_Static_assert(sizeof(float) == 4, "'<f4' is read straight into float");

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_MAX_ELEMENTS (INT64_C(1) << 62)
/* NumPy itself refuses headers over 10000 bytes by default; far more than a
 * three-key dict needs, and a bound on what a hostile length field can make
 * the reader allocate. */
#define NPY_MAX_HEADER_LEN (1u << 20)
#define NPY_MAX_TOKEN 64
#define NPY_ALIGN 64

static int fail(char *msg, size_t msglen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *msg, size_t msglen, int code, const char *fmt, ...)
{
	if (msg && msglen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, msglen, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* A token from the file, quoted for a message: printable ASCII kept, the
 * rest escaped, cut at NPY_MAX_TOKEN bytes. */
static void quote_token(char *dst, size_t dstlen, const unsigned char *src, size_t len)
{
	size_t o = 0;
	for (size_t i = 0; i < len && i < NPY_MAX_TOKEN && o + 5 < dstlen; i++) {
		if (src[i] >= 0x20 && src[i] < 0x7f && src[i] != '\\')
			dst[o++] = (char)src[i];
		else
			o += (size_t)snprintf(dst + o, dstlen - o, "\\x%02x", src[i]);
	}
	if (len > NPY_MAX_TOKEN && o + 4 < dstlen) {
		memcpy(dst + o, "...", 3);
		o += 3;
	}
	dst[o < dstlen ? o : dstlen - 1] = '\0';
}

static void format_shape(char *dst, size_t dstlen, int ndim, const int64_t *shape)
{
	size_t o = (size_t)snprintf(dst, dstlen, "(");
	for (int i = 0; i < ndim && o < dstlen; i++) {
		if (shape[i] < 0)
			o += (size_t)snprintf(dst + o, dstlen - o, "%s*", i ? ", " : "");
		else
			o += (size_t)snprintf(dst + o, dstlen - o, "%s%lld", i ? ", " : "",
			                      (long long)shape[i]);
	}
	if (o < dstlen)
		snprintf(dst + o, dstlen - o, ndim == 1 ? ",)" : ")");
}

/* ---- header parsing ------------------------------------------------------ */

struct cursor {
	const unsigned char *p, *end, *base;
	char *msg;
	size_t msglen;
};

static size_t at(const struct cursor *c)
{
	return (size_t)(c->p - c->base);
}

static void skip_space(struct cursor *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
		c->p++;
}

static int expect_char(struct cursor *c, char ch, const char *what)
{
	skip_space(c);
	if (c->p >= c->end)
		return fail(c->msg, c->msglen, RMOE_EFORMAT,
		            "header ends where %s was expected (byte %zu)", what, at(c));
	if (*c->p != (unsigned char)ch)
		return fail(c->msg, c->msglen, RMOE_EFORMAT,
		            "header has '%c' where %s was expected (byte %zu)",
		            *c->p >= 0x20 && *c->p < 0x7f ? *c->p : '?', what, at(c));
	c->p++;
	return 0;
}

/* A Python string literal without escapes: on success *s, *len point into the
 * buffer. */
static int parse_string(struct cursor *c, const unsigned char **s, size_t *len, const char *what)
{
	skip_space(c);
	if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
		return fail(c->msg, c->msglen, RMOE_EFORMAT,
		            "header has no quoted string where %s was expected (byte %zu)", what, at(c));
	const unsigned char quote = *c->p++;
	const unsigned char *start = c->p;
	while (c->p < c->end && *c->p != quote && *c->p != '\\' && *c->p != '\n' &&
	       (size_t)(c->p - start) <= NPY_MAX_TOKEN)
		c->p++;
	if (c->p >= c->end || *c->p != quote)
		return fail(c->msg, c->msglen, RMOE_EFORMAT,
		            "header has an unterminated, escaped or overlong string at byte %zu",
		            (size_t)(start - 1 - c->base));
	*s = start;
	*len = (size_t)(c->p - start);
	c->p++;
	return 0;
}

static int token_is(const unsigned char *s, size_t len, const char *word)
{
	return len == strlen(word) && memcmp(s, word, len) == 0;
}

static int parse_bool(struct cursor *c, int *value)
{
	skip_space(c);
	const unsigned char *start = c->p;
	while (c->p < c->end && c->p - start < NPY_MAX_TOKEN &&
	       ((*c->p >= 'a' && *c->p <= 'z') || (*c->p >= 'A' && *c->p <= 'Z')))
		c->p++;
	const size_t len = (size_t)(c->p - start);
	if (token_is(start, len, "False"))
		*value = 0;
	else if (token_is(start, len, "True"))
		*value = 1;
	else
		return fail(c->msg, c->msglen, RMOE_EFORMAT,
		            "fortran_order is not True or False (byte %zu)", (size_t)(start - c->base));
	return 0;
}

/* '(' [int {',' int} [',']] ')', each int decimal (a Python 2 'L' suffix
 * allowed), each extent and the product of the non-zero extents at most
 * 2^62: a zero extent empties the array but must not let the others grow
 * without bound, since readers multiply subsets of them (a row's size). */
static int parse_shape(struct cursor *c, int *ndim, int64_t *shape)
{
	int rc = expect_char(c, '(', "'(' opening the shape");
	if (rc)
		return rc;
	int n = 0, trailing_comma = 0;
	int64_t elements = 1;   /* of the non-zero extents */
	for (;;) {
		skip_space(c);
		if (c->p < c->end && *c->p == ')')
			break;
		if (c->p >= c->end)
			return fail(c->msg, c->msglen, RMOE_EFORMAT, "header ends inside the shape");
		if (*c->p < '0' || *c->p > '9')
			return fail(c->msg, c->msglen, RMOE_EFORMAT,
			            "shape has something other than a non-negative integer at byte %zu",
			            at(c));
		if (n == RMOE_NPY_MAXDIM)
			return fail(c->msg, c->msglen, RMOE_EFORMAT,
			            "shape has more than %d dimensions", RMOE_NPY_MAXDIM);
		int64_t extent = 0;
		while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
			const int digit = *c->p - '0';
			if (extent > (NPY_MAX_ELEMENTS - digit) / 10)
				return fail(c->msg, c->msglen, RMOE_EFORMAT,
				            "shape has an extent over 2^62 at byte %zu", at(c));
			extent = extent * 10 + digit;
			c->p++;
		}
		if (c->p < c->end && *c->p == 'L')
			c->p++;
		if (extent > 0 && elements > NPY_MAX_ELEMENTS / extent)
			return fail(c->msg, c->msglen, RMOE_EFORMAT,
			            "shape has more than 2^62 elements (zero extents aside)");
		if (extent > 0)
			elements *= extent;
		shape[n++] = extent;
		trailing_comma = 0;
		skip_space(c);
		if (c->p < c->end && *c->p == ',') {
			c->p++;
			trailing_comma = 1;
			continue;
		}
		if (c->p < c->end && *c->p == ')')
			break;
		if (c->p >= c->end)
			return fail(c->msg, c->msglen, RMOE_EFORMAT, "header ends inside the shape");
		return fail(c->msg, c->msglen, RMOE_EFORMAT,
		            "shape has no ',' or ')' after an extent (byte %zu)", at(c));
	}
	c->p++;
	/* "(5)" is the integer 5 in Python, not a 1-tuple. */
	if (n == 1 && !trailing_comma)
		return fail(c->msg, c->msglen, RMOE_EFORMAT,
		            "shape is not a tuple (a 1-tuple needs a trailing comma)");
	*ndim = n;
	return 0;
}

/* The fixed part before the dict: the magic, the version and the dict's
 * length, which must lie within len; *prefix is the fixed part's size. */
static int parse_prefix(const unsigned char *buf, size_t len, size_t *prefix, size_t *header_len, char *msg,
                        size_t msglen)
{
	if (len < NPY_MAGIC_LEN || memcmp(buf, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
		return fail(msg, msglen, RMOE_EFORMAT, "not a .npy file (bad magic)");
	if (len < NPY_MAGIC_LEN + 2)
		return fail(msg, msglen, RMOE_EFORMAT, "header truncated after the magic");
	const unsigned major = buf[6], minor = buf[7];
	if (major < 1 || major > 3 || minor != 0)
		return fail(msg, msglen, RMOE_EFORMAT,
		            "unsupported .npy version %u.%u (1.0, 2.0 and 3.0 are read)", major, minor);
	*prefix = major == 1 ? 10 : 12;
	if (len < *prefix)
		return fail(msg, msglen, RMOE_EFORMAT, "header truncated in its length field");
	*header_len = (size_t)buf[8] | (size_t)buf[9] << 8;
	if (major > 1)
		*header_len |= (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
	if (*header_len > NPY_MAX_HEADER_LEN)
		return fail(msg, msglen, RMOE_EFORMAT,
		            "header length %zu over the %u bytes accepted", *header_len,
		            NPY_MAX_HEADER_LEN);
	if (*header_len > len - *prefix)
		return fail(msg, msglen, RMOE_EFORMAT,
		            "header length %zu runs past the end (%zu bytes after the length field)",
		            *header_len, len - *prefix);
	return 0;
}

/* What the dict says. */
struct npy_dict {
	const unsigned char *descr;
	size_t descr_len;
	int fortran_order, ndim;
	int64_t extents[RMOE_NPY_MAXDIM];
};

/* The dict: descr, fortran_order and shape, each once, in any order, and
 * nothing after it but spaces. */
static int parse_dict(struct cursor *c, struct npy_dict *d)
{
	int rc = expect_char(c, '{', "'{' opening the header dict");
	if (rc)
		return rc;
	int seen_descr = 0, seen_order = 0, seen_shape = 0;
	for (;;) {
		skip_space(c);
		if (c->p < c->end && *c->p == '}')
			break;
		const unsigned char *key;
		size_t key_len;
		if ((rc = parse_string(c, &key, &key_len, "a key")))
			return rc;
		if ((rc = expect_char(c, ':', "':' after a key")))
			return rc;
		int *seen;
		if (token_is(key, key_len, "descr")) {
			seen = &seen_descr;
			rc = parse_string(c, &d->descr, &d->descr_len, "the dtype");
		} else if (token_is(key, key_len, "fortran_order")) {
			seen = &seen_order;
			rc = parse_bool(c, &d->fortran_order);
		} else if (token_is(key, key_len, "shape")) {
			seen = &seen_shape;
			rc = parse_shape(c, &d->ndim, d->extents);
		} else {
			char quoted[4 * NPY_MAX_TOKEN + 8];
			quote_token(quoted, sizeof(quoted), key, key_len);
			return fail(c->msg, c->msglen, RMOE_EFORMAT, "header has an unknown key '%s'", quoted);
		}
		if (rc)
			return rc;
		if (*seen)
			return fail(c->msg, c->msglen, RMOE_EFORMAT, "header repeats the key '%.*s'",
			            (int)key_len, (const char *)key);
		*seen = 1;
		skip_space(c);
		if (c->p < c->end && *c->p == ',') {
			c->p++;
			continue;
		}
		if ((rc = expect_char(c, '}', "',' or '}' after a value")))
			return rc;
		c->p--;
		break;
	}
	c->p++;
	skip_space(c);
	if (c->p != c->end)
		return fail(c->msg, c->msglen, RMOE_EFORMAT, "header has bytes after its dict (byte %zu)",
		            at(c));
	if (!seen_descr || !seen_order || !seen_shape)
		return fail(c->msg, c->msglen, RMOE_EFORMAT, "header lacks the key '%s'",
		            !seen_descr ? "descr" : !seen_order ? "fortran_order" : "shape");
	return 0;
}

int rmoe_npy_parse_header(const unsigned char *buf, size_t len, int *ndim, int64_t *shape,
                          size_t *data_offset, char *msg, size_t msglen)
{
	size_t prefix = 0, header_len = 0;
	int rc = parse_prefix(buf, len, &prefix, &header_len, msg, msglen);
	if (rc)
		return rc;
	struct cursor c = { buf + prefix, buf + prefix + header_len, buf, msg, msglen };
	struct npy_dict d = {0};
	if ((rc = parse_dict(&c, &d)))
		return rc;
	if (!token_is(d.descr, d.descr_len, "<f4")) {
		char quoted[4 * NPY_MAX_TOKEN + 8];
		quote_token(quoted, sizeof(quoted), d.descr, d.descr_len);
		return fail(msg, msglen, RMOE_EFORMAT,
		            "dtype '%s' but expected '<f4' (float32, little-endian)", quoted);
	}
	if (d.fortran_order)
		return fail(msg, msglen, RMOE_EFORMAT,
		            "fortran_order is True but expected False (C order)");
	*ndim = d.ndim;
	memcpy(shape, d.extents, (size_t)d.ndim * sizeof(*shape));
	*data_offset = prefix + header_len;
	return 0;
}

/* ---- reading ------------------------------------------------------------- */

static int read_exact(FILE *f, void *dst, size_t len)
{
	return fread(dst, 1, len, f) == len ? 0 : -1;
}

/* The file's header, read and parsed: its shape, where the data starts, and
 * the file's size (*size_out). */
static int read_header(const char *path, FILE *f, uint64_t *size_out, int *dims, int64_t *shape,
                       size_t *data_offset, char *msg, size_t msglen)
{
	struct stat st;
	if (fstat(fileno(f), &st) != 0)
		return fail(msg, msglen, RMOE_EIO, "%s: cannot stat: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return fail(msg, msglen, RMOE_EIO, "%s: not a regular file", path);
	const uint64_t size = (uint64_t)st.st_size;
	*size_out = size;
	if (size == 0)
		return fail(msg, msglen, RMOE_EFORMAT, "%s: empty file, not a .npy file", path);

	unsigned char prefix[12];
	const size_t prefix_len = size < sizeof(prefix) ? (size_t)size : sizeof(prefix);
	if (read_exact(f, prefix, prefix_len) != 0)
		return fail(msg, msglen, RMOE_EIO, "%s: read failed: %s", path,
		            ferror(f) ? strerror(errno) : "unexpected end of file");
	/* Only to learn how much to read; the parser repeats every check. */
	char detail[512];
	size_t header_end = prefix_len;
	if (prefix_len >= 8 && memcmp(prefix, NPY_MAGIC, NPY_MAGIC_LEN) == 0 && prefix[6] >= 1 &&
	    prefix[6] <= 3) {
		const size_t fixed = prefix[6] == 1 ? 10 : 12;
		if (prefix_len >= fixed) {
			size_t header_len = (size_t)prefix[8] | (size_t)prefix[9] << 8;
			if (fixed == 12)
				header_len |= (size_t)prefix[10] << 16 | (size_t)prefix[11] << 24;
			if (header_len <= NPY_MAX_HEADER_LEN) {
				if (fixed + header_len > size)
					return fail(msg, msglen, RMOE_EFORMAT,
					            "%s: header length %zu runs past the end of the file "
					            "(%llu bytes)",
					            path, header_len, (unsigned long long)size);
				header_end = fixed + header_len;
			}
		}
	}
	unsigned char *header = malloc(header_end > prefix_len ? header_end : prefix_len);
	if (!header)
		return fail(msg, msglen, RMOE_ENOMEM, "%s: no memory for a %zu-byte header", path,
		            header_end);
	memcpy(header, prefix, prefix_len);
	int rc = 0;
	if (header_end > prefix_len && read_exact(f, header + prefix_len, header_end - prefix_len))
		rc = fail(msg, msglen, RMOE_EIO, "%s: read failed: %s", path,
		          ferror(f) ? strerror(errno) : "unexpected end of file");
	else if (rmoe_npy_parse_header(header, header_end, dims, shape, data_offset, detail,
	                               sizeof(detail)) != 0)
		rc = fail(msg, msglen, RMOE_EFORMAT, "%s: %s", path, detail);
	free(header);
	return rc;
}

/* Rows [row0, row0 + nrows) of the file into data (nrows -1: to its end),
 * its shape first checked against expect_shape (an extent -1: any), which
 * then takes the file's. */
static int read_checked(const char *path, FILE *f, int ndim, int64_t *expect_shape, int64_t row0,
                        int64_t nrows, float *data, char *msg, size_t msglen)
{
	uint64_t size = 0;
	int dims = 0;
	int64_t shape[RMOE_NPY_MAXDIM];
	size_t data_offset;
	int rc = read_header(path, f, &size, &dims, shape, &data_offset, msg, msglen);
	if (rc)
		return rc;

	int match = dims == ndim;
	for (int i = 0; match && i < ndim; i++)
		match = expect_shape[i] < 0 || expect_shape[i] == shape[i];
	if (!match) {
		char found[RMOE_NPY_MAXDIM * 24 + 8], wanted[RMOE_NPY_MAXDIM * 24 + 8];
		format_shape(found, sizeof(found), dims, shape);
		format_shape(wanted, sizeof(wanted), ndim, expect_shape);
		return fail(msg, msglen, RMOE_EFORMAT, "%s: shape %s but expected %s", path, found,
		            wanted);
	}

	int64_t elements = 1, row_elements = 1;
	for (int i = 0; i < dims; i++)
		elements *= shape[i];
	for (int i = 1; i < dims; i++)
		row_elements *= shape[i];
	const uint64_t available = size - data_offset;
	if ((uint64_t)elements > available / sizeof(float))
		return fail(msg, msglen, RMOE_EFORMAT,
		            "%s: truncated: shape needs %lld float32 values after the header, "
		            "the file has %llu bytes there",
		            path, (long long)elements, (unsigned long long)available);

	const int64_t rows = dims > 0 ? shape[0] : 1;
	if (nrows < 0)
		nrows = rows - row0;
	if (row0 > rows || nrows > rows - row0)
		return fail(msg, msglen, RMOE_EFORMAT,
		            "%s: rows [%lld, %lld) requested but the file has %lld", path,
		            (long long)row0, (long long)(row0 + nrows), (long long)rows);
	for (int i = 0; i < ndim; i++)
		expect_shape[i] = shape[i];
	if (!data || nrows == 0 || row_elements == 0)
		return 0;

	const uint64_t offset = data_offset + (uint64_t)row0 * (uint64_t)row_elements * sizeof(float);
	const size_t count = (size_t)nrows * (size_t)row_elements;
	if (fseeko(f, (off_t)offset, SEEK_SET) != 0)
		return fail(msg, msglen, RMOE_EIO, "%s: cannot seek to byte %llu: %s", path,
		            (unsigned long long)offset, strerror(errno));
	if (fread(data, sizeof(float), count, f) != count)
		return fail(msg, msglen, ferror(f) ? RMOE_EIO : RMOE_EFORMAT,
		            "%s: read of %zu float32 values failed: %s", path, count,
		            ferror(f) ? strerror(errno) : "unexpected end of file");
	return 0;
}

int rmoe_npy_read_f32(const char *path, int ndim, int64_t *expect_shape, int64_t row0,
                      int64_t nrows, float *data, char *msg, size_t msglen)
{
	if (!path)
		return fail(msg, msglen, RMOE_EINVAL, "npy read: no path given");
	if (ndim < 0 || ndim > RMOE_NPY_MAXDIM || (ndim > 0 && !expect_shape))
		return fail(msg, msglen, RMOE_EINVAL, "%s: %d expected dimensions (0 to %d, with a shape)",
		            path, ndim, RMOE_NPY_MAXDIM);
	if (row0 < 0 || nrows < -1 || (ndim == 0 && (row0 != 0 || nrows > 1)))
		return fail(msg, msglen, RMOE_EINVAL, "%s: invalid row range start %lld, count %lld",
		            path, (long long)row0, (long long)nrows);
	FILE *f = fopen(path, "rb");
	if (!f)
		return fail(msg, msglen, RMOE_EIO, "%s: cannot open: %s", path, strerror(errno));
	int rc = read_checked(path, f, ndim, expect_shape, row0, nrows, data, msg, msglen);
	fclose(f);
	return rc;
}

/* ---- writing ------------------------------------------------------------- */

/* descr: NumPy's name of the 4-byte element type ('<f4', '<i4'). */
static int write_4byte(const char *path, const char *descr, int ndim, const int64_t *shape, const void *data,
                       char *msg, size_t msglen)
{
	if (!path)
		return fail(msg, msglen, RMOE_EINVAL, "npy write: no path given");
	if (ndim < 0 || ndim > RMOE_NPY_MAXDIM || (ndim > 0 && !shape))
		return fail(msg, msglen, RMOE_EINVAL, "%s: %d dimensions (0 to %d, with a shape)", path,
		            ndim, RMOE_NPY_MAXDIM);
	int64_t elements = 1;
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0 || (shape[i] > 0 && elements > NPY_MAX_ELEMENTS / shape[i]))
			return fail(msg, msglen, RMOE_EINVAL,
			            "%s: extent %lld of dimension %d is negative or the shape too large",
			            path, (long long)shape[i], i);
		elements *= shape[i];
	}
	if (elements > 0 && !data)
		return fail(msg, msglen, RMOE_EINVAL, "%s: no data for %lld values", path,
		            (long long)elements);

	char shape_text[RMOE_NPY_MAXDIM * 24 + 8];
	format_shape(shape_text, sizeof(shape_text), ndim, shape);
	char header[512];
	memcpy(header, NPY_MAGIC "\x01\x00", 8);
	const size_t dict_len = (size_t)snprintf(header + 10, sizeof(header) - 10,
	                                         "{'descr': '%s', 'fortran_order': False, "
	                                         "'shape': %s, }",
	                                         descr, shape_text);
	/* The dict, padded with spaces to a NPY_ALIGN multiple and ended by '\n',
	 * as NumPy writes it. */
	const size_t total = (10 + dict_len + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
	memset(header + 10 + dict_len, ' ', total - 10 - dict_len - 1);
	header[total - 1] = '\n';
	header[8] = (char)((total - 10) & 0xff);
	header[9] = (char)((total - 10) >> 8);

	const size_t tmp_len = strlen(path) + 32;
	char *tmp = malloc(tmp_len);
	if (!tmp)
		return fail(msg, msglen, RMOE_ENOMEM, "%s: no memory for a file name", path);
	snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());

	int rc = 0;
	FILE *f = fopen(tmp, "wb");
	if (!f) {
		rc = fail(msg, msglen, RMOE_EIO, "%s: cannot create %s: %s", path, tmp,
		          strerror(errno));
		free(tmp);
		return rc;
	}
	if (fwrite(header, 1, total, f) != total ||
	    (elements > 0 && fwrite(data, 4, (size_t)elements, f) != (size_t)elements) ||
	    fflush(f) != 0 || fsync(fileno(f)) != 0)
		rc = fail(msg, msglen, RMOE_EIO, "%s: write to %s failed: %s", path, tmp,
		          strerror(errno));
	if (fclose(f) != 0 && !rc)
		rc = fail(msg, msglen, RMOE_EIO, "%s: closing %s failed: %s", path, tmp,
		          strerror(errno));
	if (!rc && rename(tmp, path) != 0)
		rc = fail(msg, msglen, RMOE_EIO, "%s: cannot rename %s to it: %s", path, tmp,
		          strerror(errno));
	if (rc)
		remove(tmp);
	free(tmp);
	return rc;
}

int rmoe_npy_write_f32(const char *path, int ndim, const int64_t *shape, const float *data,
                       char *msg, size_t msglen)
{
	return write_4byte(path, "<f4", ndim, shape, data, msg, msglen);
}

int rmoe_npy_write_i32(const char *path, int ndim, const int64_t *shape, const int32_t *data,
                       char *msg, size_t msglen)
{
	return write_4byte(path, "<i4", ndim, shape, data, msg, msglen);
}
