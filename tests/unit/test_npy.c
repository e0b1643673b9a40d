/* .npy reading and writing: round trips, row slices, and for each way a file
 * can be wrong, the error code and a message that names the file. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmocka_main.h"
#include "npy.h"
#include "relaymoe/relaymoe.h"
#include "seeded.h"

#define SEED 7u

struct npy_dir {
	char root[256];
	char path[512];
};

static int setup_dir(void **state)
{
	struct npy_dir *d = calloc(1, sizeof(*d));
	if (!d)
		return -1;
	const char *tmp = getenv("TMPDIR");
	snprintf(d->root, sizeof(d->root), "%s/rmoe_test_npy_XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(d->root)) {
		free(d);
		return -1;
	}
	*state = d;
	return 0;
}

static void remove_tree(const char *path)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return;
	if (S_ISDIR(st.st_mode)) {
		chmod(path, 0700);
		DIR *dir = opendir(path);
		if (dir) {
			struct dirent *ent;
			char child[1024];
			while ((ent = readdir(dir))) {
				if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, ".."))
					continue;
				snprintf(child, sizeof(child), "%s/%s", path, ent->d_name);
				remove_tree(child);
			}
			closedir(dir);
		}
		rmdir(path);
	} else {
		unlink(path);
	}
}

static int teardown_dir(void **state)
{
	struct npy_dir *d = *state;
	remove_tree(d->root);
	free(d);
	return 0;
}

/* A fresh, empty directory per test, so that listings only see its files. */
static const char *test_path(void **state, const char *test, const char *name)
{
	struct npy_dir *d = *state;
	snprintf(d->path, sizeof(d->path), "%s/%s", d->root, test);
	mkdir(d->path, 0700);
	snprintf(d->path, sizeof(d->path), "%s/%s/%s", d->root, test, name);
	return d->path;
}

static int count_entries(const char *dirpath)
{
	DIR *dir = opendir(dirpath);
	assert_non_null(dir);
	int n = 0;
	struct dirent *ent;
	while ((ent = readdir(dir)))
		n += strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..");
	closedir(dir);
	return n;
}

static void parent_of(const char *path, char *dir, size_t len)
{
	snprintf(dir, len, "%s", path);
	char *slash = strrchr(dir, '/');
	assert_non_null(slash);
	*slash = '\0';
}

static void write_bytes(const char *path, const void *bytes, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(bytes, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

/* magic, version major.0, header length, dict, padding, '\n': as NumPy
 * lays a header out (padded to 64 bytes), with any dict text. */
static size_t header_bytes(unsigned char *buf, size_t cap, int major, const char *dict)
{
	const size_t fixed = major == 1 ? 10 : 12, dict_len = strlen(dict);
	const size_t total = (fixed + dict_len + 1 + 63) / 64 * 64;
	assert_true(total <= cap);
	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = (unsigned char)major;
	buf[7] = 0;
	const size_t header_len = total - fixed;
	for (size_t i = 0; i < fixed - 8; i++)
		buf[8 + i] = (unsigned char)(header_len >> (8 * i));
	memcpy(buf + fixed, dict, dict_len);
	memset(buf + fixed + dict_len, ' ', total - fixed - dict_len - 1);
	buf[total - 1] = '\n';
	return total;
}

/* A file with the given dict and nbytes of float data after it. */
static void write_npy_file(const char *path, int major, const char *dict, size_t nbytes)
{
	unsigned char buf[4096];
	float values[256];
	const size_t len = header_bytes(buf, sizeof(buf), major, dict);
	assert_true(len + nbytes <= sizeof(buf) && nbytes <= sizeof(values));
	rmoe_seeded_uniform(values, (int64_t)(nbytes / 4), SEED, RMOE_STREAM_USER, 0, 1.0f);
	memcpy(buf + len, values, nbytes);
	write_bytes(path, buf, len + nbytes);
}

static void assert_error(int rc, int code, const char *msg, const char *path, const char *detail)
{
	if (rc != code || !strstr(msg, path) || !strstr(msg, detail))
		fail_msg("got %d \"%s\", expected %d with \"%s\" and \"%s\"", rc, msg, code, path,
		         detail);
}

/* A (rows, cols) float32 file of seeded values in data, written by the library. */
static void write_seeded(const char *path, int64_t rows, int64_t cols, float *data)
{
	const int64_t shape[2] = { rows, cols };
	char msg[512];
	rmoe_seeded_uniform(data, rows * cols, SEED, RMOE_STREAM_USER, 0, 1.0f);
	assert_int_equal(rmoe_npy_write_f32(path, 2, shape, data, msg, sizeof(msg)), 0);
}

/* ---- round trips ---------------------------------------------------------- */

static void test_npy_round_trip(void **state)
{
	/* including a scalar and an empty array */
	const int64_t shapes[][3] = { { 8, 64, 0 }, { 5, 0, 0 }, { 2, 3, 4 }, { 0, 7, 0 }, { 0 } };
	const int ndims[] = { 2, 1, 3, 2, 0 };
	for (int s = 0; s < 5; s++) {
		char name[32];
		snprintf(name, sizeof(name), "a%d.npy", s);
		const char *path = test_path(state, "round_trip", name);
		int64_t n = 1;
		for (int i = 0; i < ndims[s]; i++)
			n *= shapes[s][i];
		float *data = malloc((size_t)(n + 1) * sizeof(float));
		float *back = malloc((size_t)(n + 1) * sizeof(float));
		assert_true(data && back);
		rmoe_seeded_uniform(data, n, SEED, RMOE_STREAM_USER + 1, 0, 3.0f);
		char msg[512] = "";
		assert_int_equal(rmoe_npy_write_f32(path, ndims[s], shapes[s], data, msg, sizeof(msg)), 0);

		int64_t expect[3] = { shapes[s][0], shapes[s][1], shapes[s][2] };
		assert_int_equal(rmoe_npy_read_f32(path, ndims[s], expect, 0, -1, back, msg, sizeof(msg)),
		                 0);
		assert_memory_equal(data, back, (size_t)n * sizeof(float));
		struct stat st;
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal((st.st_size - (off_t)n * 4) % 64, 0);
		free(data);
		free(back);
	}
	char dir[512];
	parent_of(test_path(state, "round_trip", "x"), dir, sizeof(dir));
	/* no temporary file left behind */
	assert_int_equal(count_entries(dir), 5);
}

/* Byte for byte what numpy.save writes for float32 (8, 64). */
static void test_npy_header_is_numpys(void **state)
{
	const char *path = test_path(state, "header", "x.npy");
	float data[8 * 64];
	write_seeded(path, 8, 64, data);
	char msg[512];
	unsigned char header[128];
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fread(header, 1, sizeof(header), f), sizeof(header));
	fclose(f);
	const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 64), }";
	assert_memory_equal(header, "\x93NUMPY\x01\x00\x76\x00", 10);
	assert_memory_equal(header + 10, dict, sizeof(dict) - 1);
	for (size_t i = 10 + sizeof(dict) - 1; i < 127; i++)
		assert_int_equal(header[i], ' ');
	assert_int_equal(header[127], '\n');

	const int64_t one[1] = { 5 };
	assert_int_equal(rmoe_npy_write_f32(path, 1, one, data, msg, sizeof(msg)), 0);
	f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fread(header, 1, sizeof(header), f), sizeof(header));
	fclose(f);
	assert_memory_equal(header + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }",
	                    57);
	assert_int_equal(header[127], '\n');
}

/* int32 (a dump's topk_idx.npy): NumPy's '<i4' header, then the values. */
static void test_npy_int32_is_numpys(void **state)
{
	const char *path = test_path(state, "int32", "topk_idx.npy");
	const int64_t shape[2] = { 6, 4 };
	int32_t data[24];
	float u[24];
	rmoe_seeded_uniform(u, 24, SEED, RMOE_STREAM_USER + 2, 0, 1.0f);
	for (int i = 0; i < 24; i++)
		data[i] = (int32_t)(u[i] * 1000.0f) - 500;
	char msg[512] = "";
	assert_int_equal(rmoe_npy_write_i32(path, 2, shape, data, msg, sizeof(msg)), 0);
	unsigned char file[128 + sizeof(data)];
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fread(file, 1, sizeof(file), f), sizeof(file));
	assert_int_equal(fgetc(f), EOF);
	fclose(f);
	const char dict[] = "{'descr': '<i4', 'fortran_order': False, 'shape': (6, 4), }";
	assert_memory_equal(file + 10, dict, sizeof(dict) - 1);
	assert_int_equal(file[127], '\n');
	assert_memory_equal(file + 128, data, sizeof(data));
	/* the float reader refuses it, naming the dtype */
	int64_t expect[2] = { 6, 4 };
	float back[24];
	assert_true(rmoe_npy_read_f32(path, 2, expect, 0, -1, back, msg, sizeof(msg)) < 0);
	assert_non_null(strstr(msg, "<i4"));
}

static void test_npy_any_extent_is_reported(void **state)
{
	const char *path = test_path(state, "any_extent", "x.npy");
	float data[32], back[32];
	write_seeded(path, 8, 4, data);
	char msg[512];

	int64_t expect[2] = { -1, 4 };
	assert_int_equal(rmoe_npy_read_f32(path, 2, expect, 0, -1, NULL, msg, sizeof(msg)), 0);
	assert_int_equal(expect[0], 8);
	int64_t both[2] = { -1, -1 };
	assert_int_equal(rmoe_npy_read_f32(path, 2, both, 0, -1, back, msg, sizeof(msg)), 0);
	assert_int_equal(both[0], 8);
	assert_int_equal(both[1], 4);
	assert_memory_equal(data, back, sizeof(data));
}

static void test_npy_slice_read(void **state)
{
	const char *path = test_path(state, "slice", "x.npy");
	float data[30], back[30];
	write_seeded(path, 10, 3, data);
	char msg[512];

	int64_t expect[2] = { 10, 3 };
	assert_int_equal(rmoe_npy_read_f32(path, 2, expect, 4, 3, back, msg, sizeof(msg)), 0);
	assert_memory_equal(back, data + 4 * 3, 3 * 3 * sizeof(float));
	assert_int_equal(rmoe_npy_read_f32(path, 2, expect, 6, -1, back, msg, sizeof(msg)), 0);
	assert_memory_equal(back, data + 6 * 3, 4 * 3 * sizeof(float));
	assert_int_equal(rmoe_npy_read_f32(path, 2, expect, 10, 0, back, msg, sizeof(msg)), 0);

	assert_error(rmoe_npy_read_f32(path, 2, expect, 8, 3, back, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "rows [8, 11) requested but the file has 10");
	assert_error(rmoe_npy_read_f32(path, 2, expect, -1, 3, back, msg, sizeof(msg)), RMOE_EINVAL,
	             msg, path, "row range");
}

static void test_npy_version_2_and_3_headers(void **state)
{
	for (int major = 2; major <= 3; major++) {
		const char *path = test_path(state, "versions", major == 2 ? "v2.npy" : "v3.npy");
		write_npy_file(path, major, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }",
		               24);
		float back[6], want[6];
		rmoe_seeded_uniform(want, 6, SEED, RMOE_STREAM_USER, 0, 1.0f);
		int64_t expect[2] = { 3, 2 };
		char msg[512] = "";
		assert_int_equal(rmoe_npy_read_f32(path, 2, expect, 0, -1, back, msg, sizeof(msg)), 0);
		assert_memory_equal(back, want, sizeof(want));
	}
}

/* ---- malformed files ------------------------------------------------------ */

static void test_npy_bad_magic(void **state)
{
	const char *path = test_path(state, "bad_magic", "x.npy");
	unsigned char buf[256] = { 0 };
	size_t len = header_bytes(buf, sizeof(buf), 1,
	                          "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }");
	buf[5] = 'Z';
	write_bytes(path, buf, len + 8);
	int64_t expect[1] = { 2 };
	float back[2];
	char msg[512];
	assert_error(rmoe_npy_read_f32(path, 1, expect, 0, -1, back, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "bad magic");
	write_bytes(path, "PK\x03\x04", 4);
	assert_error(rmoe_npy_read_f32(path, 1, expect, 0, -1, back, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "bad magic");
}

static void test_npy_wrong_dtype(void **state)
{
	const char *dicts[] = {
		"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }",
		"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }",
		"{'descr': '|f4', 'fortran_order': False, 'shape': (2, 2), }",
	};
	const char *named[] = { "dtype '<f8' but expected '<f4'", "dtype '>f4' but expected '<f4'",
	                        "dtype '|f4' but expected '<f4'" };
	const char *path = test_path(state, "dtype", "x.npy");
	for (int i = 0; i < 3; i++) {
		write_npy_file(path, 1, dicts[i], 32);
		int64_t expect[2] = { 2, 2 };
		float back[8];
		char msg[512];
		assert_error(rmoe_npy_read_f32(path, 2, expect, 0, -1, back, msg, sizeof(msg)),
		             RMOE_EFORMAT, msg, path, named[i]);
	}
}

static void test_npy_fortran_order(void **state)
{
	const char *path = test_path(state, "fortran", "x.npy");
	write_npy_file(path, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16);
	int64_t expect[2] = { 2, 2 };
	float back[4];
	char msg[512];
	assert_error(rmoe_npy_read_f32(path, 2, expect, 0, -1, back, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "fortran_order is True");
}

static void test_npy_wrong_shape(void **state)
{
	const char *path = test_path(state, "shape", "x.npy");
	float data[8 * 64];
	write_seeded(path, 8, 64, data);
	char msg[512], want[600];

	int64_t expect[2] = { 16, 64 };
	assert_int_equal(rmoe_npy_read_f32(path, 2, expect, 0, -1, data, msg, sizeof(msg)),
	                 RMOE_EFORMAT);
	snprintf(want, sizeof(want), "%s: shape (8, 64) but expected (16, 64)", path);
	assert_string_equal(msg, want);
	assert_int_equal(expect[0], 16);

	int64_t three[3] = { 8, 64, -1 };
	assert_int_equal(rmoe_npy_read_f32(path, 3, three, 0, -1, data, msg, sizeof(msg)),
	                 RMOE_EFORMAT);
	snprintf(want, sizeof(want), "%s: shape (8, 64) but expected (8, 64, *)", path);
	assert_string_equal(msg, want);
}

static void test_npy_truncated_data(void **state)
{
	const char *path = test_path(state, "truncated", "x.npy");
	float data[8 * 64];
	write_seeded(path, 8, 64, data);
	char msg[512];
	assert_int_equal(truncate(path, 128 + 8 * 64 * 4 - 4), 0);
	int64_t expect[2] = { 8, 64 };
	assert_error(rmoe_npy_read_f32(path, 2, expect, 0, -1, data, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "truncated");
	/* even when only the header is asked for, or a slice the file still holds */
	assert_error(rmoe_npy_read_f32(path, 2, expect, 0, -1, NULL, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "truncated");
	assert_error(rmoe_npy_read_f32(path, 2, expect, 0, 1, data, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "truncated");
}

static void test_npy_empty_file(void **state)
{
	const char *path = test_path(state, "empty", "x.npy");
	write_bytes(path, "", 0);
	int64_t expect[1] = { -1 };
	char msg[512];
	assert_error(rmoe_npy_read_f32(path, 1, expect, 0, -1, NULL, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "empty");
}

static void test_npy_header_length_past_eof(void **state)
{
	const char *path = test_path(state, "header_past_eof", "x.npy");
	unsigned char buf[128];
	header_bytes(buf, sizeof(buf), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }");
	buf[8] = 0xe8; /* 1000 */
	buf[9] = 0x03;
	write_bytes(path, buf, 64);
	int64_t expect[1] = { 2 };
	char msg[512];
	assert_error(rmoe_npy_read_f32(path, 1, expect, 0, -1, NULL, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "header length 1000 runs past the end");
	/* a file that ends inside the fixed part */
	write_bytes(path, buf, 9);
	assert_error(rmoe_npy_read_f32(path, 1, expect, 0, -1, NULL, msg, sizeof(msg)), RMOE_EFORMAT,
	             msg, path, "truncated");
}

static void test_npy_missing_file(void **state)
{
	const char *path = test_path(state, "missing", "absent.npy");
	int64_t expect[1] = { -1 };
	char msg[512];
	assert_error(rmoe_npy_read_f32(path, 1, expect, 0, -1, NULL, msg, sizeof(msg)), RMOE_EIO, msg,
	             path, "cannot open");
}

/* ---- the writer leaves nothing behind when it fails ------------------------ */

static void test_npy_write_failure_leaves_no_file(void **state)
{
	const int64_t shape[2] = { 4, 4 };
	float data[16];
	rmoe_seeded_uniform(data, 16, SEED, RMOE_STREAM_USER, 0, 1.0f);
	char msg[512], dir[512];

	/* the directory does not exist */
	const char *path = test_path(state, "write_fail", "no_such_dir/x.npy");
	assert_error(rmoe_npy_write_f32(path, 2, shape, data, msg, sizeof(msg)), RMOE_EIO, msg, path,
	             "cannot create");
	parent_of(test_path(state, "write_fail", "x"), dir, sizeof(dir));
	assert_int_equal(count_entries(dir), 0);

	/* the target is a directory: the data is complete, the rename fails,
	 * and the temporary file goes */
	path = test_path(state, "write_fail", "target");
	assert_int_equal(mkdir(path, 0700), 0);
	assert_error(rmoe_npy_write_f32(path, 2, shape, data, msg, sizeof(msg)), RMOE_EIO, msg, path,
	             "rename");
	assert_int_equal(count_entries(dir), 1);
	assert_int_equal(count_entries(path), 0);

	/* the directory is not writable (root writes anyway) */
	if (geteuid() != 0) {
		char locked[600];
		snprintf(locked, sizeof(locked), "%s/locked", dir);
		assert_int_equal(mkdir(locked, 0500), 0);
		snprintf(locked, sizeof(locked), "%s/locked/x.npy", dir);
		assert_error(rmoe_npy_write_f32(locked, 2, shape, data, msg, sizeof(msg)), RMOE_EIO,
		             msg, locked, "cannot create");
		locked[strlen(locked) - strlen("/x.npy")] = '\0';
		assert_int_equal(count_entries(locked), 0);
	}

	/* a shape the writer refuses */
	const int64_t negative[2] = { 4, -4 };
	path = test_path(state, "write_fail", "neg.npy");
	assert_error(rmoe_npy_write_f32(path, 2, negative, data, msg, sizeof(msg)), RMOE_EINVAL, msg,
	             path, "negative");
	assert_int_equal(access(path, F_OK), -1);
}

/* ---- the header parser on hostile input ------------------------------------ */

static int parse(const unsigned char *bytes, size_t len, char *msg, size_t msglen)
{
	/* An exact-size heap copy, so that a read past len is a sanitizer error. */
	unsigned char *copy = malloc(len ? len : 1);
	assert_non_null(copy);
	memcpy(copy, bytes, len);
	int ndim = -1;
	int64_t shape[RMOE_NPY_MAXDIM];
	size_t offset = 0;
	int rc = rmoe_npy_parse_header(copy, len, &ndim, shape, &offset, msg, msglen);
	if (rc == 0) {
		assert_true(ndim >= 0 && ndim <= RMOE_NPY_MAXDIM);
		assert_true(offset <= len);
		int64_t n = 1;
		for (int i = 0; i < ndim; i++) {
			assert_true(shape[i] >= 0 && shape[i] <= (INT64_C(1) << 62));
			if (shape[i] == 0)
				n = 0;
			else
				assert_true(n <= (INT64_C(1) << 62) / shape[i]);
			n *= shape[i];
		}
	} else {
		assert_int_equal(rc, RMOE_EFORMAT);
		assert_true(strlen(msg) > 0);
	}
	free(copy);
	return rc;
}

static void test_npy_parse_header_rejects_hostile_headers(void **state)
{
	(void)state;
	const struct {
		const char *dict;
		const char *detail;
	} bad[] = {
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387905,), }",
		  "extent over 2^62" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }",
		  "extent over 2^62" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
		  "more than 2^62 elements" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }",
		  "more than 8 dimensions" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 2), }", "non-negative" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (5), }", "not a tuple" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': 5, }", "'('" },
		{ "{'descr': '<f4', 'fortran_order': False, }", "lacks the key 'shape'" },
		{ "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (), }",
		  "repeats the key 'descr'" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", "unknown key 'x'" },
		{ "{'descr': '<f4, 'fortran_order': False, 'shape': (), }", "'f'" },
		{ "{'descr': '<f4', 'fortran_order': 0, 'shape': (), }", "not True or False" },
		{ "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (), }", "dtype" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (), } x", "after its dict" },
		{ "['descr', '<f4']", "'{'" },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2,", "header ends" },
	};
	unsigned char buf[512];
	char msg[512];
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const size_t len = header_bytes(buf, sizeof(buf), 1, bad[i].dict);
		assert_int_equal(parse(buf, len, msg, sizeof(msg)), RMOE_EFORMAT);
		if (!strstr(msg, bad[i].detail))
			fail_msg("header %s: message \"%s\" lacks \"%s\"", bad[i].dict, msg,
			         bad[i].detail);
	}

	/* lengths and versions */
	size_t len = header_bytes(buf, sizeof(buf), 1, "{'descr': '<f4', 'fortran_order': False, "
	                                               "'shape': (2, 3), }");
	assert_int_equal(parse(buf, len, msg, sizeof(msg)), 0);
	for (size_t cut = 0; cut < len; cut++)
		assert_int_equal(parse(buf, cut, msg, sizeof(msg)), RMOE_EFORMAT);
	buf[6] = 4;
	assert_int_equal(parse(buf, len, msg, sizeof(msg)), RMOE_EFORMAT);
	assert_non_null(strstr(msg, "version 4.0"));
	len = header_bytes(buf, sizeof(buf), 2, "{'descr': '<f4', 'fortran_order': False, "
	                                        "'shape': (), }");
	buf[11] = 0x7f; /* a 2 GB header */
	assert_int_equal(parse(buf, len, msg, sizeof(msg)), RMOE_EFORMAT);
	/* the message of a short buffer is cut, never overrun */
	char small[8];
	memset(small, 'x', sizeof(small));
	assert_int_equal(parse(buf, len, small, sizeof(small)), RMOE_EFORMAT);
	assert_int_equal(small[7], '\0');
}

/* Seeded mutations of a valid header: whatever the bytes, the parser
 * answers 0 with a sane shape or RMOE_EFORMAT, and reads nothing past len. */
static void test_npy_parse_header_survives_mutations(void **state)
{
	(void)state;
	unsigned char valid[256], buf[256];
	char msg[256];
	const size_t valid_len = header_bytes(valid, sizeof(valid), 1,
	                                      "{'descr': '<f4', 'fortran_order': False, "
	                                      "'shape': (12, 345, 6789), }");
	const unsigned char alphabet[] = "(){}[],:'\" 0123456789TrueFalsL<>f4\n\x93\xff";
	int accepted = 0;
	for (uint64_t trial = 0; trial < 20000; trial++) {
		memcpy(buf, valid, valid_len);
		size_t len = valid_len;
		uint64_t r = rmoe_seeded_u64(SEED, RMOE_STREAM_USER + 2, trial);
		const int edits = 1 + (int)(r % 4);
		for (int e = 0; e < edits; e++) {
			r = rmoe_seeded_u64(SEED, RMOE_STREAM_USER + 3, trial * 8 + (uint64_t)e);
			const size_t at = (size_t)(r % len);
			switch ((r >> 32) % 4) {
			case 0:
				buf[at] = alphabet[(r >> 40) % (sizeof(alphabet) - 1)];
				break;
			case 1:
				buf[at] = (unsigned char)(r >> 48);
				break;
			case 2:
				len = at + 1;
				break;
			default:
				/* the length field, where a mutation hurts most */
				buf[8 + (r >> 40) % 2] = (unsigned char)(r >> 48);
				break;
			}
		}
		accepted += parse(buf, len, msg, sizeof(msg)) == 0;
	}
	/* some mutations (inside padding, digits) leave a valid header */
	assert_true(accepted > 0);
}

RMOE_TEST_MAIN(setup_dir, teardown_dir,
               cmocka_unit_test(test_npy_round_trip),
               cmocka_unit_test(test_npy_header_is_numpys),
               cmocka_unit_test(test_npy_int32_is_numpys),
               cmocka_unit_test(test_npy_any_extent_is_reported),
               cmocka_unit_test(test_npy_slice_read),
               cmocka_unit_test(test_npy_version_2_and_3_headers),
               cmocka_unit_test(test_npy_bad_magic),
               cmocka_unit_test(test_npy_wrong_dtype),
               cmocka_unit_test(test_npy_fortran_order),
               cmocka_unit_test(test_npy_wrong_shape),
               cmocka_unit_test(test_npy_truncated_data),
               cmocka_unit_test(test_npy_empty_file),
               cmocka_unit_test(test_npy_header_length_past_eof),
               cmocka_unit_test(test_npy_missing_file),
               cmocka_unit_test(test_npy_write_failure_leaves_no_file),
               cmocka_unit_test(test_npy_parse_header_rejects_hostile_headers),
               cmocka_unit_test(test_npy_parse_header_survives_mutations))
